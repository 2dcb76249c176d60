"""Validation: which sentences its BLEU scores, that its number is sacreBLEU's, and that
its loss is every sentence's token cross-entropy."""

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from conftest import compose_train, make_pairs, write_text_corpus
from tinymt import runtime
from tinymt.data import prepare
from tinymt.tokenizer import BOS_ID, EOS_ID
from tinymt.trainer.loop import build_model
from tinymt.trainer.validation import validate


def test_bleu_subset_spans_a_split_listed_by_length(tmp_path):
    # Tatoeba's file lists sentences by length: the first k of valid are the shortest
    valid = sorted(make_pairs(40, 1, max_len=14), key=lambda p: len(p[0].split()))
    corpus = write_text_corpus(tmp_path / "corpus", {
        "train": make_pairs(200, 0), "valid": valid, "test": make_pairs(5, 2)})
    cfg = compose_train(tmp_path, "data=text_files", f"data.path={corpus}",
                        "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=40",
                        "trainer.max_tokens=64")  # several padded batches
    data = prepare(cfg.data, log=lambda *a: None)
    model = build_model(cfg, data)
    rt = runtime.setup("cpu", "fp32", num_threads=1)

    out = validate(model, cfg, data, "valid", rt, limit=8)

    length = [len(s.split()) for s, _ in valid]
    picked = [len(s.split()) for s in out["srcs"]]
    assert len(picked) == 8 and set(zip(out["srcs"], out["refs"])) <= set(valid)
    assert min(picked) == min(length) and max(picked) >= sorted(length)[-5]
    assert abs(sum(picked) / 8 - sum(length) / 40) < 1.5
    assert out["bleu"] == sacrebleu.corpus_bleu(out["hyps"], [out["refs"]]).score

    whole = validate(model, cfg, data, "valid", rt, limit=0)
    assert list(zip(whole["srcs"], whole["refs"])) == valid

    # the loss over the whole split: each sentence alone (no batch, no padding), plain
    # cross-entropy of the output projection's logits, summed over tokens
    nll = tokens = 0
    with torch.no_grad():
        for src, tgt in zip(*data.ids("valid")):
            tgt = [BOS_ID, *map(int, tgt), EOS_ID]
            hidden, _ = model(torch.tensor([[*map(int, src), EOS_ID]]), torch.tensor([tgt[:-1]]))
            nll += F.cross_entropy(model.output_proj(hidden)[0], torch.tensor(tgt[1:]),
                                   reduction="sum").item()
            tokens += len(tgt) - 1
    assert whole["loss"] == pytest.approx(nll / tokens, rel=1e-5)
