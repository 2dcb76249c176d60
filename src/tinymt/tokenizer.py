"""Sentencepiece wrapper with the project's fixed special ids (pad=0, unk=1, bos=2, eos=3).

One :class:`Tokenizer` wraps one sentencepiece model. A joint vocabulary is one model
used for both sides (``save_tokenizers`` writes it as ``spm.model`` and
``load_tokenizers`` returns the same object twice); separate vocabularies are
``src.model`` and ``tgt.model``. ``encode`` never adds bos/eos: :func:`tinymt.batching.collate`
adds them where the model wants them.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import math
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as spm_pb

from tinymt.errors import TinyMTError
from tinymt.files import write_bytes

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
JOINT_MODEL = "spm.model"
SRC_MODEL = "src.model"
TGT_MODEL = "tgt.model"
# sentencepiece samples this many sentences (shuffled) when the corpus is bigger
INPUT_SENTENCE_SIZE = 1_000_000
SPM_SEED = 1234
# the trainer_spec fields that change how text is encoded or decoded; the rest of it
# (the build's temporary model_prefix, thread count, sampling sizes) records how the
# model was made, not what it is
ENCODING_FIELDS = ("model_type", "treat_whitespace_as_suffix", "allow_whitespace_only_pieces",
                   "byte_fallback", "unk_surface", "unk_id", "bos_id", "eos_id", "pad_id")

_WORD = re.compile("\u2581[^\u2581]*|[^\u2581]+")  # ▁word: BPE pieces never span two words


def _num_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _as_int_list(ids) -> list[int]:
    if hasattr(ids, "tolist"):  # torch tensor / numpy array
        ids = ids.tolist()
    return [int(i) for i in ids]


class Tokenizer:
    """One sentencepiece model; ids 0-3 are always pad/unk/bos/eos (:meth:`train` makes
    them so; a run's tokenizer is bound to its checkpoints by :func:`tokenizer_digest`)."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, processor: spm.SentencePieceProcessor, model_path: Path):
        self.sp = processor
        self.model_path = Path(model_path)

    @classmethod
    def train(cls, sentences: Iterable[str], model_path: Path, vocab_size: int,
              model_type: str = "bpe", character_coverage: float = 1.0) -> Tokenizer:
        """Train a model on ``sentences`` and write it to ``model_path`` (``*.model``)."""
        spm.set_random_generator_seed(SPM_SEED)  # sentence sampling: same corpus, same model
        written = io.BytesIO()  # in memory: sentencepiece's own writer ignores a full disk
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=written,
                vocab_size=int(vocab_size), model_type=model_type,
                character_coverage=float(character_coverage),
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
                input_sentence_size=INPUT_SENTENCE_SIZE, shuffle_input_sentence=True,
                num_threads=_num_threads(), minloglevel=2)
        except RuntimeError as e:  # its own words say what to set instead ("a value <= 23")
            raise TinyMTError(f"data.vocab_size={vocab_size} does not suit this corpus "
                              f"(sentencepiece: {str(e).split('] ', 1)[-1].strip()})") from None
        # written by us (a full disk is an error, not a truncated file), without the thread
        # count: the same corpus and settings give the same bytes wherever they are built
        proto = spm_pb.ModelProto()
        proto.ParseFromString(written.getvalue())
        proto.trainer_spec.ClearField("num_threads")
        write_bytes(proto.SerializeToString(deterministic=True), model_path)
        return cls.load(model_path)

    @classmethod
    def load(cls, model_path: Path) -> Tokenizer:
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(model_path))
        except (OSError, RuntimeError) as e:
            raise TinyMTError(f"{model_path} is not a sentencepiece model ({e})") from None
        return cls(processor, model_path)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text``, without bos/eos."""
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of each text (sentencepiece's multi-threaded batch encode)."""
        return self.sp.encode(list(texts), out_type=int, num_threads=_num_threads())

    def encode_sampled(self, texts: Sequence[str], alpha: float, nbest_size: int,
                       seed: int) -> list[list[int]]:
        """Piece ids of each text under subword regularization, the same for the same
        ``seed`` in any process: for a BPE model, :func:`bpe_dropout` with probability
        ``alpha``; for a unigram one, a draw among the ``nbest_size`` best segmentations
        with probability proportional to ``P(pieces) ** alpha``. Not sentencepiece's
        ``enable_sampling``: its BPE drops a merge for the rest of the word, and its
        generator is not reproducible across processes (a resumed run or a second DDP rank
        would see other data). A sentence with a character the vocabulary lacks keeps its
        fixed segmentation."""
        rng = random.Random(seed)
        tables = self._sampling_tables()
        if tables["unigram"]:
            return [_draw_nbest(self, text, alpha, nbest_size, rng) for text in texts]
        scores, piece_ids, starts = tables["scores"], tables["ids"], tables["first_pairs"]
        out = []
        for text in texts:
            pieces = []
            for word in _WORD.findall(self.sp.normalize(text)):
                if word not in starts:
                    starts[word] = first_pairs(word, scores)
                pieces += bpe_dropout(word, scores, alpha, rng.random, starts[word])
            ids = [piece_ids.get(p, -1) for p in pieces]
            out.append(self.encode(text) if -1 in ids else ids)
        return out

    def _sampling_tables(self) -> dict:
        """What :meth:`encode_sampled` reads, built once: whether the model is unigram,
        ``{piece: score}`` and ``{piece: id}`` of the normal pieces (what BPE may merge
        into), and the :func:`first_pairs` of every word drawn so far."""
        if "_sampling" not in self.__dict__:
            proto = spm_pb.ModelProto.FromString(self.sp.serialized_model_proto())
            normal = [(i, p) for i, p in enumerate(proto.pieces) if p.type == p.NORMAL]
            self._sampling = {
                "unigram": proto.trainer_spec.model_type == proto.trainer_spec.UNIGRAM,
                "scores": {p.piece: p.score for _, p in normal},
                "ids": {p.piece: i for i, p in normal},
                "first_pairs": {},
            }
        return self._sampling

    def decode(self, ids) -> str:
        """Text of ``ids``: stops at the first eos, drops pad and bos."""
        ids = _as_int_list(ids)
        ids = ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids
        return self.sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def pieces(self, ids) -> list[str]:
        """One label per id (specials included), for attention-map axes."""
        return [self.sp.id_to_piece(i) for i in _as_int_list(ids)]


def tokenizer_digest(src: Tokenizer, tgt: Tokenizer) -> str:
    """sha256 of what the source and target sentencepiece models *are* (a joint one once): their
    pieces (with scores and types), normaliser and denormaliser, and the trainer settings that
    change encoding (``ENCODING_FIELDS``); not where or how fast they were built. It binds a
    checkpoint to the exact tokenizer it was trained with (the same vocabulary size is not
    enough), and a rebuild of the same data config gives the same digest."""
    h = hashlib.sha256()
    for tok in dict.fromkeys((src, tgt)):
        proto = spm_pb.ModelProto.FromString(tok.sp.serialized_model_proto())
        kept = spm_pb.TrainerSpec()
        for name in ENCODING_FIELDS:
            if proto.trainer_spec.HasField(name):
                setattr(kept, name, getattr(proto.trainer_spec, name))
        proto.trainer_spec.CopyFrom(kept)
        h.update(proto.SerializeToString(deterministic=True))
    return h.hexdigest()


def save_tokenizers(folder: Path, src: Tokenizer, tgt: Tokenizer) -> None:
    """Copy the model(s) into ``folder``: ``spm.model`` when joint, else src/tgt.model."""
    pairs = [(src, JOINT_MODEL)] if src is tgt else [(src, SRC_MODEL), (tgt, TGT_MODEL)]
    for tok, name in pairs:
        write_bytes(tok.sp.serialized_model_proto(), folder / name)  # = its file's bytes


def load_tokenizers(folder: Path) -> tuple[Tokenizer, Tokenizer]:
    """``(src, tgt)`` from ``folder``; the same object twice for a joint vocabulary."""
    if (folder / JOINT_MODEL).is_file():
        tok = Tokenizer.load(folder / JOINT_MODEL)
        return tok, tok
    if (folder / SRC_MODEL).is_file() and (folder / TGT_MODEL).is_file():
        return Tokenizer.load(folder / SRC_MODEL), Tokenizer.load(folder / TGT_MODEL)
    raise TinyMTError(f"no tokenizer in {folder}: expected {JOINT_MODEL} (joint vocabulary) or "
                      f"both {SRC_MODEL} and {TGT_MODEL} (separate vocabularies)")


def first_pairs(word: str, table: dict[str, float]) -> list[tuple[float, int, int, int]]:
    """BPE's agenda before any merge: every adjacent character pair that is a piece, as a
    heap of ``(-score, left, right, merged length)``; the same for every draw of a word."""
    agenda = [(-table[word[i:i + 2]], i, i + 1, 2)
              for i in range(len(word) - 1) if word[i:i + 2] in table]
    heapq.heapify(agenda)
    return agenda


def bpe_dropout(word: str, table: dict[str, float], p: float, rand,
                start: list | None = None) -> list[str]:
    """BPE-dropout on one word, as published (Provilkov et al. 2020, Algorithm 1, and the
    authors' code in subword-nmt). Each merge step:

    1. every adjacent pair whose merge is a piece is a candidate, each occurrence dropped
       with probability ``p`` (``rand()`` draws) *for this step only*;
    2. no candidate left: stop;
    3. the best kept candidate (highest piece score, leftmost on ties) is merged, together
       with every other kept occurrence of the same pair, left to right.

    ``p=0`` is plain BPE, the model's own segmentation (sentencepiece's sampling drops a
    pair for the rest of the word: about twice as many pieces at the same ``p``).
    ``start``: the word's :func:`first_pairs`, when the caller keeps them (not changed).
    The agenda is a heap, so a step looks only at candidates down to the first one kept:
    the same distribution as drawing every occurrence, at a few draws per step."""
    sym = list(word)  # the piece starting at each character; "" once merged into its left
    if len(sym) < 2:
        return sym
    nxt, prv = [*range(1, len(sym)), -1], [*range(-1, len(sym) - 1)]
    agenda = list(start) if start is not None else first_pairs(word, table)
    pop, push, get = heapq.heappop, heapq.heappush, table.get

    def live(entry) -> bool:  # False: one side has merged since the pair was listed
        _, left, right, size = entry
        a, b = sym[left], sym[right]
        return bool(a) and bool(b) and len(a) + len(b) == size

    def merge(left: int, right: int, fresh: list) -> None:
        sym[left] += sym[right]
        sym[right] = ""
        nxt[left] = after = nxt[right]
        if after >= 0:
            prv[after] = left
        for lo, hi in ((prv[left], left), (left, after)):  # the merged piece's new neighbours
            if lo >= 0 and hi >= 0:
                piece = sym[lo] + sym[hi]
                score = get(piece)
                if score is not None:
                    fresh.append((-score, lo, hi, len(piece)))

    while agenda:
        dropped, fresh, chosen = [], [], None
        while agenda:  # 1-3: the best candidate this step keeps
            entry = pop(agenda)
            if not live(entry):
                continue  # stale: gone for good (its successors were listed when it went)
            if p > 0 and rand() < p:
                dropped.append(entry)  # back on the agenda for the next step
                continue
            chosen = entry
            break
        if chosen is None:
            break
        pair = (sym[chosen[1]], sym[chosen[2]])
        merge(chosen[1], chosen[2], fresh)
        while agenda and agenda[0][0] == chosen[0]:  # 3: the same pair further right
            entry = pop(agenda)
            if not live(entry):
                continue  # stale, or overlapping a merge of this step
            if (sym[entry[1]], sym[entry[2]]) == pair and not (p > 0 and rand() < p):
                merge(entry[1], entry[2], fresh)
            else:
                dropped.append(entry)  # another pair of equal score, or dropped
        for entry in dropped + fresh:
            push(agenda, entry)
    return [s for s in sym if s]


def _draw_nbest(tok: Tokenizer, text: str, alpha: float, nbest_size: int, rng) -> list[int]:
    """One of the ``nbest_size`` best unigram segmentations, weighted ``exp(alpha * logP)``."""
    candidates = tok.sp.nbest_encode(text, nbest_size=nbest_size, out_type=int)
    if len(candidates) < 2:
        return candidates[0] if candidates else tok.encode(text)
    logp = [sum(tok.sp.get_score(i) for i in ids) for ids in candidates]
    weights = [math.exp(alpha * (lp - max(logp))) for lp in logp]
    return rng.choices(candidates, weights)[0]  # (one draw: rng.random() times their sum)
