"""One probe sentence at one step, as the attention viewer draws it: the *view document*.

Every home of the viewer (the TensorBoard tab, the self-contained HTML file, the tour
notebook) draws the same document::

    {"sentence": "我请李雷帮我订了去北京的机票。", "reference": "I asked ..." | None,
     "translation": "I asked ...",         # the model's own greedy output at this step
     "forced": "reference" | "translation",  # the target the decoder read (teacher forcing)
     "step": 800, "scale": 255,            # weights are integers 0..scale
     "kinds": {kind: {"rows": [query tokens], "cols": [key tokens],
                      "weights": uint8 (layers, heads, T_q, T_k),
                      "entropy": [[nats per head] per layer],
                      "gold": [[row, col, label], ...],
                      "labels": [[str per head] per layer]}}}  # optional: the trainer's

``labels`` (records the trainer writes): what each head does at that step, measured on the
first validation sentences (:func:`tinymt.labels.frame_labels`), ``"object ← 0.62 ·
accuracy 0.62 over 40 instances · baseline 0.45: the word at offset -2"``: the label, then
what was measured.

Rows and columns: ``encoder_self`` reads the source pieces + ``</s>`` on both axes;
``decoder_self`` the decoder input ``<s>`` + target pieces on both (row i is the query at
position i, which may look at columns 0..i); ``cross`` has a row per target piece the
query *predicts* (target pieces + ``</s>``) and a column per source position.

Gold (built-in corpus only): cross cells whose words are linked in the gold word
alignment ("aligned"), and self-attention cells whose words are joined by a gold relation
(:mod:`tinymt.corpus.relations`): ``"subject →"`` where the query is the dependent and
the key its head, ``"subject ←"`` the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tinymt import KINDS
from tinymt.corpus import SHOWCASE, Pair
from tinymt.corpus.relations import RELATIONS
from tinymt.data import normalize
from tinymt.metrics import attention_entropy
from tinymt.relations import relation_heads, row_label
from tinymt.words import pieces_to_words

SCALE = 255  # weights are stored as round(w * SCALE): 8 bits each, error <= 0.5 / SCALE
# the built-in corpus's gold columns in a prepared split (tinymt.data), named as Probe's fields
GOLD_COLUMNS = ("src_words", "tgt_words", "alignment", "src_relations", "tgt_relations")


@dataclass(frozen=True)
class Probe:
    """A sentence whose attention is watched: its text, a reference translation to
    teacher-force (``None``: the model's own translation is forced) and, on the built-in
    corpus, the gold words (``src_words``/``tgt_words``, ``alignment`` as ``(src word,
    tgt word)`` pairs, relations as ``(relation, dependent, head)`` word triples)."""

    sentence: str
    reference: str | None = None
    src_words: Sequence[str] = ()
    tgt_words: Sequence[str] = ()
    alignment: Sequence[Sequence[int]] = ()
    src_relations: Sequence[Sequence[int]] = ()
    tgt_relations: Sequence[Sequence[int]] = ()


def probe_from_pair(pair: Pair) -> Probe:
    """A built-in corpus pair as a zh→en probe, with its gold words."""
    return Probe(pair.zh, pair.en, pair.zh_words, pair.en_words, pair.alignment,
                 pair.zh_relations, pair.en_relations)


def translation_document(attn: dict[str, list[np.ndarray]], src_pieces: Sequence[str],
                         out_pieces: Sequence[str], sentence: str, translation: str, step: int,
                         gold: bool) -> dict:
    """The document of a sentence teacher-forced on the model's own translation (what
    ``translate.py attention=*.html`` and the tour show). With ``gold`` (a zh→en run of
    the built-in corpus), a showcase sentence brings its gold words; the target side's
    only when the translation is the reference itself."""
    pair = {normalize(p.zh): p for p in SHOWCASE}.get(normalize(sentence)) if gold else None
    probe = probe_from_pair(pair) if pair else Probe(sentence.strip())
    return build_document(attn, src_pieces, out_pieces, probe, translation, step,
                          forced_reference=pair is not None and translation == pair.en)


def build_document(attn: dict[str, list[np.ndarray]], src_pieces: Sequence[str],
                   tgt_pieces: Sequence[str], probe: Probe, translation: str, step: int,
                   forced_reference: bool) -> dict:
    """The view document of one probe (module docstring); ``attn`` as
    :func:`tinymt.attention_maps.collect_attention` returns it for ``src_pieces`` and the
    forced ``tgt_pieces`` (no specials)."""
    src = list(src_pieces) + ["</s>"]
    axes = {"encoder_self": (src, src),
            "decoder_self": (["<s>"] + list(tgt_pieces), ["<s>"] + list(tgt_pieces)),
            "cross": (list(tgt_pieces) + ["</s>"], src)}
    gold, words = _gold_cells(probe, src_pieces, tgt_pieces, forced_reference)
    kinds = {}
    for kind in (k for k in KINDS if k in attn):
        w = np.stack([np.asarray(layer, dtype=np.float64) for layer in attn[kind]])
        rows, cols = axes[kind]
        kinds[kind] = {"rows": rows, "cols": cols,
                       "weights": np.clip(np.rint(w * SCALE), 0, SCALE).astype(np.uint8),
                       "entropy": attention_entropy(w).mean(-1).round(4).tolist(),
                       "gold": gold.get(kind, [])}
        if kind in words:  # each relation of the sentence and the head that carries it
            kinds[kind]["relations"] = _relation_heads(w, *words[kind])
    return {"sentence": probe.sentence, "reference": probe.reference, "translation": translation,
            "forced": "reference" if forced_reference else "translation",
            "step": int(step), "scale": SCALE, "kinds": kinds}


def _gold_cells(probe: Probe, src_pieces, tgt_pieces, forced_reference: bool) -> tuple[dict, dict]:
    """``{kind: [[row, col, label], ...]}`` from the probe's gold words (none without), and
    per self-attention kind ``(word of each position, the words, relations, causal)``."""
    gold: dict[str, list] = {}
    words: dict[str, tuple] = {}
    src_w = pieces_to_words(src_pieces, probe.src_words) + [-1] if probe.src_words else None
    # target words only when the decoder read the reference those words spell
    tgt_w = pieces_to_words(tgt_pieces, probe.tgt_words) \
        if probe.tgt_words and forced_reference else None
    if src_w is not None:
        gold["encoder_self"] = _relation_cells(src_w, src_w, probe.src_relations, False)
        words["encoder_self"] = (src_w, probe.src_words, probe.src_relations, False)
    if tgt_w is not None:
        dec_in = [-1] + tgt_w  # <s> + pieces
        gold["decoder_self"] = _relation_cells(dec_in, dec_in, probe.tgt_relations, True)
        words["decoder_self"] = (dec_in, probe.tgt_words, probe.tgt_relations, True)
    if src_w is not None and tgt_w is not None:
        links = {(int(s), int(t)) for s, t in probe.alignment}
        rows = tgt_w + [-1]  # the piece each query predicts, then </s>
        gold["cross"] = [[i, j, "aligned"] for i, t in enumerate(rows) if t >= 0
                         for j, s in enumerate(src_w) if s >= 0 and (s, t) in links]
    return gold, words


def _relation_heads(w: np.ndarray, positions: list[int], words, relations, causal: bool
                    ) -> list[list]:
    """``[[query word, partner, "object ←", layer, head, weight], ...]``: each gold relation
    and the head putting the most of the query word's attention on its partner
    (:func:`tinymt.relations.relation_heads`; ``w``: (layers, heads, T, T))."""
    onehot = np.array([[p == i for i in range(len(words))] for p in positions], np.float64)
    return [[words[x["query"]], words[x["key"]], row_label(x), *x["head"], round(x["weight"], 3)]
            for x in relation_heads(w, onehot, [tuple(map(int, r)) for r in relations], causal)]


def _relation_cells(row_words: list[int], col_words: list[int], relations,
                    causal: bool) -> list[list]:
    """Cells joining the two words of a gold relation, labelled by direction."""
    pairs: dict[tuple[int, int], str] = {}
    for rel, dep, head in relations:
        name = RELATIONS[int(rel)]
        pairs.setdefault((int(dep), int(head)), f"{name} →")
        pairs.setdefault((int(head), int(dep)), f"{name} ←")
    return [[i, j, pairs[qw, kw]] for i, qw in enumerate(row_words)
            for j, kw in enumerate(col_words)
            if (qw, kw) in pairs and qw >= 0 and kw >= 0 and qw != kw and not (causal and j > i)]


def jsonable(doc: dict) -> dict:
    """The document with its weight arrays as nested lists (what the views receive)."""
    return {**doc, "kinds": {k: {**v, "weights": np.asarray(v["weights"]).tolist()}
                             for k, v in doc["kinds"].items()}}


def document_json(doc: dict) -> bytes:
    """JSON that parses as ``json.dumps(jsonable(doc))``: ASCII, no NaN (``ValueError``),
    the weights by :func:`_weights_json`: 16 Mi of them in 0.4 s, where ``tolist`` and
    ``json.dumps`` take 4 s and twice the memory, holding the GIL throughout (numpy's loops
    release it: a server's other threads wait a few ms at most)."""
    def dumps(obj) -> bytes:  # a non-empty object without its closing brace
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)[:-1].encode()

    parts = [dumps({k: v for k, v in doc.items() if k != "kinds"}), b',"kinds":{']
    for i, (kind, view) in enumerate(doc["kinds"].items()):
        parts += [b"," if i else b"", json.dumps(kind).encode(), b":",
                  dumps({k: v for k, v in view.items() if k != "weights"}),
                  b',"weights":', _weights_json(view["weights"]), b"}"]
    return b"".join([*parts, b"}}"])


def _weights_json(w) -> bytes:
    """uint8 weights (layers, heads, T_q, T_k) as JSON nested lists, written into one
    numpy buffer: 4 bytes a weight (numbers padded with spaces, which JSON allows)."""
    layers, heads, t_q, t_k = w.shape
    width = 4 * t_k + 6  # "[", a "ddd," per weight (the last comma becomes "]"), 5 after
    buf = np.full(3 + layers * heads * t_q * width, ord(" "), np.uint8)
    buf[:3] = np.frombuffer(b"[[[", np.uint8)
    rows = buf[3:].reshape(layers, heads, t_q, width)  # one line of text per row
    cells = rows[..., 1:4 * t_k + 1].reshape(layers, heads, t_q, t_k, 4)  # a view
    cells[..., 0] = np.where(w >= 100, w // 100 + 48, 32)  # 48: "0", 32: " "
    cells[..., 1] = np.where(w >= 10, w // 10 % 10 + 48, 32)
    cells[..., 2] = w % 10 + 48
    cells[..., 3] = ord(",")
    rows[..., 0], rows[..., 4 * t_k] = ord("["), ord("]")
    after = rows[..., 4 * t_k + 1:]  # what follows a row: the next row, head or layer
    after[:, :, :-1, 0] = ord(",")
    after[:, :-1, -1, :3] = np.frombuffer(b"],[", np.uint8)
    after[:-1, -1, -1, :] = np.frombuffer(b"]],[[", np.uint8)
    after[-1, -1, -1, :3] = np.frombuffer(b"]]]", np.uint8)
    return buf.tobytes()
