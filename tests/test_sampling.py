"""Subword regularization (tinymt.data.sampling): every epoch a new segmentation of the
train split, a function of (seed, epoch) alone; the pieces always spell the sentence;
batches are cut by each epoch's lengths; valid, test, probes and translation never sample;
a resumed run draws what the uninterrupted one drew. (Two processes of DDP drawing the same
global batches: tests/test_distributed.py runs with sampling on.)"""

import io
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import compose_train, compose_translate
from tinymt.batching import TokenBatchSampler
from tinymt.config import DataConfig
from tinymt.data import TrainSegments, prepare
from tinymt.data.cache import cache_key
from tinymt.tokenizer import Tokenizer
from tinymt.trainer import resume_config, train
from tinymt.translate import translate


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def data(request, tmp_path_factory):
    cfg = DataConfig(train_size=300, valid_size=20, test_size=20, vocab_size=800,
                     tokenizer_type=request.param,
                     cache_dir=str(tmp_path_factory.mktemp("cache")))
    return prepare(cfg, log=lambda *_: None)


def segments(data, seed=1, alpha=0.3, max_len=255):
    return TrainSegments(data, alpha=alpha, nbest_size=16, seed=seed, max_len=max_len)


def test_draws_differ_between_epochs_and_seeds_and_repeat_for_the_same_ones(data):
    a = segments(data)
    epochs = [a.ids(e) for e in range(3)]
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    assert segments(data, seed=2).ids(0) != epochs[0]
    # a fresh object (a resumed or another rank's process), drawing in another order
    b = segments(data)
    assert b.ids(2) == epochs[2] and b.ids(0) == epochs[0]
    a.close(), b.close()


def test_sampled_pieces_spell_the_sentence_and_differ_from_the_fixed_ones(data):
    s = segments(data)
    texts = (data.splits["train"]["src"][:], data.splits["train"]["tgt"][:])
    fixed = data.ids("train")
    for epoch in (0, 5):
        drawn = s.ids(epoch)
        for side, tok in enumerate((data.src_tokenizer, data.tgt_tokenizer)):
            assert [tok.decode(ids) for ids in drawn[side]] == texts[side]
            changed = sum(d != f for d, f in zip(drawn[side], fixed[side]))
            assert changed > len(texts[side]) // 20, (epoch, side, changed)
    s.close()


def test_without_dropout_the_draw_is_sentencepieces_own_segmentation(data):
    """The independent reference: sentencepiece's deterministic encoding of every train
    sentence (BPE: alpha 0 is plain BPE; unigram: a huge alpha leaves only the best)."""
    alpha = 1e4 if data.src_tokenizer._sampling_tables()["unigram"] else 0.0
    texts = data.splits["train"]["src"][:] + data.splits["train"]["tgt"][:]
    assert data.src_tokenizer.encode_sampled(texts, alpha, 16, seed=3) == \
        data.src_tokenizer.encode_batch(texts)


@pytest.mark.slow
def test_another_process_draws_the_same_pieces(data):
    """What a resumed run or a second DDP rank does: the same (seed, epoch) in a fresh
    interpreter. (sentencepiece's own sampling fails this: its seed is not reproducible
    across processes.)"""
    code = ("import pickle, sys; from tinymt.data.sampling import TrainSegments; "
            "data = pickle.load(open(sys.argv[1], 'rb')); "
            "sys.stdout.write(repr(TrainSegments(data, 0.3, 16, 1, 255).ids(4)))")
    path = Path(data.tokenizer_dir).parent / "data.pickle"
    path.write_bytes(pickle.dumps(data))
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True).stdout
    assert out == repr(segments(data).ids(4))


def test_no_alpha_is_the_cached_segmentation_in_every_epoch(data):
    s = segments(data, alpha=0.0)
    assert s.ids(0) is s.ids(7) is data.ids("train")
    assert all(
        (a == b).all() for a, b in zip(s.lengths(3), data.lengths("train")))


def test_a_draw_longer_than_the_model_takes_keeps_the_fixed_pieces(data):
    fixed = data.ids("train")
    cap = sorted(len(ids) for ids in fixed[1])[len(fixed[1]) // 2]  # the median length
    drawn = segments(data, max_len=cap).ids(0)
    for d, f in zip(drawn[1], fixed[1]):
        assert len(d) <= cap or d == f
    assert any(d == f and len(d) < len(sampled) for d, f, sampled in
               zip(drawn[1], fixed[1], segments(data, max_len=10**6).ids(0)[1]))


def test_each_epoch_is_cut_by_its_own_lengths(data):
    s = segments(data)
    sampler = TokenBatchSampler(*data.lengths("train"), max_tokens=200, seed=1,
                                lengths_of=s.lengths)
    for epoch in range(3):
        src, tgt = s.lengths(epoch)
        batches = sampler.batches(epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(src)))
        for b in batches:
            cost = len(b) * (max(max(src[i], tgt[i]) for i in b) + 1)
            assert cost <= 200 or len(b) == 1
    # the cut of epoch 1 is not that of the fixed lengths (what a once-cut sampler would do)
    fixed = TokenBatchSampler(*data.lengths("train"), max_tokens=200, seed=1)
    assert sorted(map(sorted, fixed.batches(1))) != sorted(map(sorted, sampler.batches(1)))
    s.close()


def test_sampling_keys_leave_the_data_cache_alone():
    assert cache_key(DataConfig(sampling_alpha=0.1)) == cache_key(DataConfig())


def _losses(run):
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    # by step: a resume in this same process and second names its event file with a counter
    # that sorts before the first file's once it reaches two digits ("...10" < "...9")
    return sorted((e.step, e.value) for e in acc.Scalars("train/loss"))


@pytest.mark.slow
def test_training_samples_only_train_sentences_and_resumes_to_the_same_draws(
        tmp_path, monkeypatch):
    """A 100-pair corpus, a few steps an epoch: 14 steps cross two epoch boundaries, and the
    resume at step 8 starts mid-epoch, re-drawing that epoch."""
    seen: list[str] = []
    real = Tokenizer.encode_sampled

    def spy(self, texts, *args):
        seen.extend(texts)
        return real(self, texts, *args)

    monkeypatch.setattr(Tokenizer, "encode_sampled", spy)
    common = ["data.train_size=100", "data.sampling_alpha=0.2", "trainer.valid_every=4",
              "trainer.max_epochs=100"]
    ref = compose_train(tmp_path / "ref", *common, "trainer.max_steps=14")
    metrics = train(ref)
    assert metrics["epochs"] >= 2
    data = prepare(ref.data, log=lambda *_: None)
    train_text = set(data.splits["train"]["src"][:]) | set(data.splits["train"]["tgt"][:])
    others = {t for split in ("valid", "test") for side in ("src", "tgt")
              for t in data.splits[split][side][:]} - train_text
    assert set(seen) <= train_text and len(set(seen)) == len(train_text)
    assert not others & set(seen)  # valid and test sentences were never sampled

    seen.clear()
    out = io.StringIO()
    translate(compose_translate(f"run={tmp_path / 'ref' / 'run'}", "decode.beam=2"),
              ["我请李雷帮我订了去北京的机票。"], stdout=out)
    assert seen == [] and out.getvalue().strip()

    cut = compose_train(tmp_path / "cut", *common, "trainer.max_steps=8")
    train(cut)
    resume = [f"trainer.resume={tmp_path / 'cut' / 'run'}", "trainer.max_steps=14"]
    train(resume_config(compose_train(tmp_path / "cut", *common, *resume), resume))
    assert _losses(tmp_path / "cut" / "run") == _losses(tmp_path / "ref" / "run")
    unsampled = compose_train(tmp_path / "plain", "data.train_size=100",
                              "trainer.valid_every=4", "trainer.max_steps=8")
    train(unsampled)
    assert _losses(tmp_path / "plain" / "run") != _losses(tmp_path / "ref" / "run")[:8]


def test_extreme_draws_against_sentencepiece(data):
    """BPE with every merge dropped (alpha 1): one piece per character; unigram: every draw
    one of sentencepiece's nbest segmentations. A character the vocabulary lacks: the fixed
    segmentation, in either."""
    tok = data.src_tokenizer
    texts = data.splits["train"]["src"][:20]
    unknown = texts[0] + " \u2603"  # a snowman: not in the built-in corpus
    drawn = tok.encode_sampled(texts + [unknown], 1.0, 4, seed=5)
    assert drawn[-1] == tok.encode(unknown)
    for text, ids in zip(texts, drawn):
        if tok._sampling_tables()["unigram"]:
            assert ids in tok.sp.nbest_encode(text, nbest_size=4, out_type=int)
        else:
            assert ids == [tok.sp.piece_to_id(c) for c in tok.sp.normalize(text)]
    assert tok.encode_sampled(texts, 1.0, 4, seed=5) == drawn[:-1]  # the same seed, the same
