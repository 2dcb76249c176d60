"""Every source -> prepared splits; cache (hit, invalidation, interrupted builds); user errors."""

import gzip
import json
import shutil
import time

import datasets
import pyarrow as pa
import pytest

import tinymt.data.pipeline
import tinymt.data.sources
from conftest import (
    make_pairs,
    run_script_in_process,
    write_text_corpus,
)
from tinymt.data import cache_path, normalize, prepare, summary_table
from tinymt.data.cache import COMPLETE
from tinymt.data.prepared import Ragged, SplitWriter
from tinymt.data.sources import as_table, load_chunks
from tinymt.errors import TinyMTError
from tinymt.files import TEMP_PREFIX
from tinymt.tokenizer import Tokenizer, tokenizer_digest


def load_columns(cfg, log) -> dict[str, dict]:
    """The raw corpus of ``cfg`` as plain columns per split (all of it in memory)."""
    out = {}
    for name, chunks in load_chunks(cfg, log).items():
        cols: dict = {}
        for chunk in chunks:
            for key, values in chunk.items():
                cols.setdefault(key, []).extend(values)
        out[name] = cols or {"src": [], "tgt": []}
    return out


def _quiet(_msg):
    pass


class Log(list):
    def __call__(self, msg):
        self.append(msg)

    def text(self):
        return "\n".join(self)


# ----------------------------------------------------------------------------------------
# text source


def test_text_source_end_to_end(text_corpus, data_cfg):
    log = Log()
    d = prepare(data_cfg(path=str(text_corpus)), log=log)
    assert d.stats["cache_hit"] is False
    assert d.stats["pairs"] == {"train": 300, "valid": 20, "test": 20}
    assert set(d.splits) == {"train", "valid", "test"}
    row = d.splits["valid"][0]
    assert set(row) == {"src", "tgt", "src_ids", "tgt_ids"}
    src0, tgt0 = make_pairs(20, 1)[0]
    assert (row["src"], row["tgt"]) == (src0, tgt0)
    # raw piece ids: no bos/eos, decode back to the text
    assert row["src_ids"] == d.src_tokenizer.encode(src0)
    assert not {0, 2, 3} & set(row["src_ids"] + row["tgt_ids"])
    assert d.tgt_tokenizer.decode(row["tgt_ids"]) == tgt0
    assert d.src_tokenizer is d.tgt_tokenizer  # joint by default
    assert (d.tokenizer_dir / "spm.model").is_file()
    assert d.stats["vocab_size"] == {"src": 40, "tgt": 40}
    for side in ("src", "tgt"):
        s = d.stats["tokens"]["train"][side]
        assert s["mean"] > 0 and s["p95"] >= s["mean"] and s["unk_pct"] == 0
    src_ids, tgt_ids = d.ids("valid")
    assert src_ids[0] == row["src_ids"] and tgt_ids[0] == row["tgt_ids"]
    assert [x.tolist() for x in d.lengths("valid")] == [[len(x) for x in src_ids],
                                                        [len(x) for x in tgt_ids]]
    # read from Arrow once: the training loop asks for the train ids at every step
    assert d.ids("valid")[0] is src_ids and d.ids("train") is d.ids("train")
    assert list(d.ids("train")[1]) == d.splits["train"]["tgt_ids"][:]
    table = summary_table(d.stats)
    assert "train" in table and "300" in table and "40 joint" in table
    assert "cache hit" not in log.text()


def test_text_gz_and_separate_vocab_and_reverse(tmp_path, data_cfg):
    folder = write_text_corpus(
        tmp_path / "gz",
        {"train": make_pairs(200, 0), "dev": make_pairs(10, 1), "test": make_pairs(10, 2)},
        suffix=".gz",
    )
    d = prepare(
        data_cfg(
            path=str(folder), valid_split="dev", joint_vocab=False, vocab_size=32, reverse=True
        ),
        log=_quiet,
    )
    assert d.src_tokenizer is not d.tgt_tokenizer
    assert sorted(p.name for p in d.tokenizer_dir.glob("*.model")) == ["src.model", "tgt.model"]
    src0, tgt0 = make_pairs(10, 1)[0]
    assert (d.splits["valid"][0]["src"], d.splits["valid"][0]["tgt"]) == (tgt0, src0)
    assert d.stats["direction"] == "en->de"


def test_normalisation_and_empty_pairs(tmp_path, data_cfg):
    pairs = make_pairs(200, 0)
    valid = [
        ("ＤＥＲ   hund\t.  ", "the dog ."),
        ("  ", "empty source"),
        ("das haus .", "the house ."),
    ]
    folder = write_text_corpus(
        tmp_path / "c", {"train": pairs + [("", "")], "valid": valid, "test": make_pairs(5, 2)}
    )
    d = prepare(data_cfg(path=str(folder)), log=_quiet)
    assert d.splits["valid"]["src"][:] == ["DER hund .", "das haus ."]  # NFKC + whitespace
    assert d.stats["dropped"]["valid"]["empty"] == 1
    assert d.stats["dropped"]["train"]["empty"] == 1
    assert d.stats["pairs"]["train"] == 200


def test_length_filters_apply_to_train_only_and_are_counted(tmp_path, data_cfg):
    long_pair = (" ".join(["katze"] * 200), " ".join(["cat"] * 200))
    skewed = ("hund .", " ".join(["dog"] * 30))
    folder = write_text_corpus(
        tmp_path / "c",
        {
            "train": make_pairs(200, 0) + [long_pair, skewed],
            "valid": make_pairs(5, 1) + [long_pair],
            "test": make_pairs(5, 2) + [skewed],
        },
    )
    log = Log()
    d = prepare(data_cfg(path=str(folder), max_len=150, max_len_ratio=3.0), log=log)
    assert d.stats["dropped"]["train"] == {"empty": 0, "max_len": 1, "max_len_ratio": 1}
    assert d.stats["pairs"]["train"] == 200
    assert "max_len 1, max_len_ratio 1" in log.text()  # what each filter removed is logged
    off = prepare(data_cfg(path=str(folder), max_len=0, max_len_ratio=0), log=_quiet)
    assert off.stats["dropped"]["train"] == {"empty": 0, "max_len": 0, "max_len_ratio": 0}
    assert off.stats["pairs"]["train"] == 202
    for p in (d, off):
        assert p.stats["pairs"]["valid"] == 6 and p.stats["pairs"]["test"] == 6  # never dropped
        assert p.stats["dropped"]["valid"] == {"empty": 0, "max_len": 0, "max_len_ratio": 0}
    assert d.stats["tokens"]["valid"]["src"]["max"] > 150  # the long pair is kept


def test_misaligned_line_counts(tmp_path, data_cfg, text_corpus):
    (text_corpus / "valid.en").write_text("only one line\n")
    with pytest.raises(TinyMTError) as e:
        prepare(data_cfg(path=str(text_corpus)), log=_quiet)
    msg = str(e.value)
    assert "valid.de" in msg and "valid.en" in msg and "20 lines" in msg and "1 lines" in msg


def test_invalid_utf8_names_file_and_line(data_cfg, text_corpus):
    lines = (text_corpus / "test.de").read_bytes().split(b"\n")
    lines[2] = b"kaputt \xff\xfe ."
    (text_corpus / "test.de").write_bytes(b"\n".join(lines))
    with pytest.raises(TinyMTError) as e:
        prepare(data_cfg(path=str(text_corpus)), log=_quiet)
    assert "test.de" in str(e.value) and "line 3" in str(e.value)


def test_missing_folder_and_file(tmp_path, data_cfg, text_corpus):
    with pytest.raises(TinyMTError, match="no train file for language") as e:
        prepare(data_cfg(path=str(tmp_path / "nowhere")), log=_quiet)
    assert str(tmp_path / "nowhere") in str(e.value)
    (text_corpus / "test.en").unlink()
    with pytest.raises(TinyMTError) as e:
        prepare(data_cfg(path=str(text_corpus)), log=_quiet)
    assert "test.en" in str(e.value) and str(text_corpus) in str(e.value)


def test_split_empty_after_filtering_names_the_filter(data_cfg, text_corpus, tmp_path):
    with pytest.raises(TinyMTError) as e:
        prepare(data_cfg(path=str(text_corpus), max_len=1), log=_quiet)
    assert "train split is empty after the max_len filter" in str(e.value)
    folder = write_text_corpus(
        tmp_path / "c", {"train": make_pairs(100), "valid": [(" ", "x")], "test": make_pairs(3)}
    )
    with pytest.raises(TinyMTError, match="valid split is empty after dropping empty pairs"):
        prepare(data_cfg(path=str(folder)), log=_quiet)


def test_vocab_too_large_says_what_to_lower_it_to(data_cfg, text_corpus):
    with pytest.raises(TinyMTError, match=r"vocab_size=20000 .*set it to a value <= \d+"):
        prepare(data_cfg(path=str(text_corpus), vocab_size=20000), log=_quiet)


def test_bad_config_values(data_cfg, text_corpus):
    with pytest.raises(TinyMTError, match="data.source"):
        prepare(data_cfg(path=str(text_corpus), source="ftp"), log=_quiet)
    with pytest.raises(TinyMTError, match="needs data.path"):
        prepare(data_cfg(path=None), log=_quiet)


# ----------------------------------------------------------------------------------------
# cache


def test_second_prepare_is_a_cache_hit(text_corpus, data_cfg):
    cfg = data_cfg(path=str(text_corpus))
    first = prepare(cfg, log=_quiet)
    model = first.tokenizer_dir / "spm.model"
    mtime = model.stat().st_mtime_ns
    log = Log()
    second = prepare(cfg, log=log)
    assert second.stats["cache_hit"]
    assert "cache hit" in log.text() and "trained" not in log.text()
    assert model.stat().st_mtime_ns == mtime  # tokenizer not retrained
    assert second.tokenizer_dir == first.tokenizer_dir
    assert second.splits["train"]["src_ids"][:] == first.splits["train"]["src_ids"][:]
    assert second.stats["pairs"] == first.stats["pairs"]
    # a different config or a changed file is a different cache entry
    assert cache_path(data_cfg(path=str(text_corpus), vocab_size=41)) != cache_path(cfg)
    before = cache_path(cfg)
    with open(text_corpus / "train.de", "a") as f, open(text_corpus / "train.en", "a") as g:
        f.write("der hund .\n")
        g.write("the dog .\n")
    assert cache_path(cfg) != before
    assert not prepare(cfg, log=_quiet).stats["cache_hit"]


def test_name_and_cache_dir_are_not_part_of_the_key(text_corpus, data_cfg, tmp_path):
    a = cache_path(data_cfg(path=str(text_corpus)))
    b = cache_path(data_cfg(path=str(text_corpus), name="other", cache_dir=str(tmp_path / "x")))
    assert a.name == b.name


def test_interrupted_build_is_not_trusted(text_corpus, data_cfg, monkeypatch):
    cfg = data_cfg(path=str(text_corpus))

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash after tokenizer training")

    monkeypatch.setattr(tinymt.data.pipeline, "side_stats", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare(cfg, log=_quiet)
    final = cache_path(cfg)
    assert not final.exists()
    assert not list(final.parent.glob(".tmp-*"))  # the temp folder is cleaned up
    monkeypatch.undo()
    d = prepare(cfg, log=_quiet)
    assert not d.stats["cache_hit"] and (final / COMPLETE).is_file()


def test_cache_folder_without_marker_is_rebuilt(text_corpus, data_cfg):
    cfg = data_cfg(path=str(text_corpus))
    final = cache_path(cfg)
    (final / "tokenizer").mkdir(parents=True)
    (final / "tokenizer" / "spm.model").write_bytes(b"half-written")
    log = Log()
    d = prepare(cfg, log=log)
    assert not d.stats["cache_hit"]
    assert f"is damaged (its {COMPLETE} marker" in log.text()
    assert (final / COMPLETE).is_file() and d.src_tokenizer.vocab_size == 40


def test_damaged_complete_cache_is_rebuilt(text_corpus, data_cfg):
    cfg = data_cfg(path=str(text_corpus))
    first = prepare(cfg, log=_quiet)
    (first.tokenizer_dir / "spm.model").write_bytes(b"garbage")
    log = Log()
    d = prepare(cfg, log=log)
    assert not d.stats["cache_hit"] and "rebuilding" in log.text()
    assert d.src_tokenizer.encode("der hund") == first.src_tokenizer.encode("der hund")


def _cli_overrides(corpus, cache) -> list[str]:
    """scripts/prepare_data.py's spelling of ``data_cfg(path=corpus)``."""
    return ["data.source=text", f"data.path={corpus}", "data.src_lang=de", "data.tgt_lang=en",
            "data.train_split=train", "data.valid_split=valid", "data.test_split=test",
            "data.vocab_size=40", f"data.cache_dir={cache}"]


def _tree(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("error", ["MemoryError()", "RuntimeError(\"can't start new thread\")"])
def test_an_error_that_is_no_damage_keeps_the_cache(text_corpus, data_cfg, tmp_path, error,
                                                    monkeypatch, capsys):
    """Any error while reading a complete cache (out of memory, no thread) once deleted it
    and rebuilt; only evidence of damage may (a digest unlike the marker's): the error is
    raised as it is. scripts/prepare_data.py, the reading failing."""
    import datasets

    cfg = data_cfg(path=str(text_corpus))
    final = prepare(cfg, log=_quiet).tokenizer_dir.parent
    before = _tree(final)

    def fail(*args, **kwargs):
        raise eval(error)

    monkeypatch.setattr(datasets, "load_from_disk", fail)
    status, stderr = run_script_in_process("prepare_data",
                                           _cli_overrides(text_corpus, cfg.cache_dir), capsys)
    assert status == 1, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: internal error ("), lines
    assert error.split("(")[0] in lines[0] and "rebuilding" not in capsys.readouterr().out
    assert _tree(final) == before


@pytest.mark.parametrize("new_id", [99999, 5])
def test_a_changed_token_id_is_damage(text_corpus, data_cfg, new_id, capsys):
    """A cached id changed after it was written (a flipped bit) was trusted: one outside
    the vocabulary failed deep inside the model, one inside it trained on another
    sentence. scripts/prepare_data.py rebuilds the entry."""
    import datasets

    cfg = data_cfg(path=str(text_corpus))
    first = prepare(cfg, log=_quiet)
    final = first.tokenizer_dir.parent
    splits = final / "splits"
    bad = datasets.load_from_disk(str(splits))
    bad["train"] = bad["train"].map(lambda row, i: {"src_ids": row["src_ids"][:-1] + [new_id]}
                                    if i == 3 else {}, with_indices=True)
    bad.save_to_disk(str(final / "bad"))
    del bad
    shutil.rmtree(splits)
    (final / "bad").rename(splits)
    capsys.readouterr()
    status, stderr = run_script_in_process("prepare_data",
                                           _cli_overrides(text_corpus, cfg.cache_dir), capsys)
    out = capsys.readouterr().out
    assert status == 0, stderr[-2000:]
    assert "was changed after it was written" in out and "rebuilding" in out
    again = prepare(cfg, log=_quiet)
    assert again.stats["cache_hit"] and list(again.ids("train")[0]) == list(first.ids("train")[0])


def test_a_failed_rebuild_keeps_the_damaged_copy(text_corpus, data_cfg, monkeypatch):
    """A rebuild never deletes the only copy before the new one is complete."""
    import tinymt.data.pipeline as pipeline

    cfg = data_cfg(path=str(text_corpus))
    final = prepare(cfg, log=_quiet).tokenizer_dir.parent
    (final / "stats.json").write_text("{half")
    damaged = _tree(final)

    def fail(*args, **kwargs):
        raise TinyMTError("the corpus could not be read")

    monkeypatch.setattr(pipeline, "_build", fail)
    with pytest.raises(TinyMTError, match="could not be read"):
        prepare(cfg, log=_quiet)
    assert _tree(final) == damaged
    monkeypatch.undo()
    log = Log()
    assert not prepare(cfg, log=log).stats["cache_hit"] and "damaged" in log.text()
    assert (final / "stats.json").read_text().startswith("{")
    assert not list(final.parent.glob(".old-*")) and not list(final.parent.glob(".tmp-*"))


def test_a_killed_build_s_temp_folder_is_harmless(text_corpus, data_cfg):
    """A killed build's temp folder (tinymt.files) is never read: the next build publishes
    the cache beside it."""
    cfg = data_cfg(path=str(text_corpus))
    root = cache_path(cfg).parent
    root.mkdir(parents=True)
    stale = root / f"{TEMP_PREFIX}deadbeef"
    stale.mkdir()
    (stale / "train.arrow").write_bytes(b"half a cache")
    assert not prepare(cfg, log=_quiet).stats["cache_hit"]
    assert sorted(p.name for p in root.iterdir()) == sorted([stale.name, cache_path(cfg).name])


# ----------------------------------------------------------------------------------------
# tsv source


def _write_tsv(path, pairs, gz=False):
    text = "".join(f"{en}\t{de}\tCC-BY attribution #{i}\n" for i, (de, en) in enumerate(pairs))
    data = ("\ufeff" + text).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_tsv_seeded_split(tmp_path, data_cfg):
    pairs = make_pairs(400, 0)
    path = _write_tsv(tmp_path / "pairs.tsv.gz", pairs, gz=True)
    cfg = {
        "source": "tsv",
        "path": str(path),
        "src_column": 1,
        "tgt_column": 0,
        "valid_size": 30,
        "test_size": 20,
        "split_seed": 7,
    }
    d = prepare(data_cfg(**cfg), log=_quiet)
    assert d.stats["pairs"] == {"train": 350, "valid": 30, "test": 20}
    assert (d.splits["train"][0]["src"], d.splits["train"][0]["tgt"]) in pairs  # columns 1 -> 0
    # the same seed gives the same split (fresh cache), another seed another one
    raw = load_columns(data_cfg(**cfg), _quiet)
    assert raw["valid"]["src"] == d.splits["valid"]["src"][:]
    other = load_columns(data_cfg(**{**cfg, "split_seed": 8}), _quiet)
    assert other["valid"]["src"] != raw["valid"]["src"]
    assert len(set(raw["test"]["src"]) | set(raw["valid"]["src"])) <= 50


def test_tsv_row_with_too_few_columns(tmp_path, data_cfg):
    path = _write_tsv(tmp_path / "pairs.tsv", make_pairs(50))
    lines = path.read_text().splitlines()
    lines[6] = "only english here"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TinyMTError) as e:
        prepare(data_cfg(source="tsv", path=str(path), valid_size=5, test_size=5), log=_quiet)
    assert "pairs.tsv" in str(e.value) and "line 7" in str(e.value)


def test_tsv_too_small_for_held_out_splits(tmp_path, data_cfg):
    path = _write_tsv(tmp_path / "pairs.tsv", make_pairs(10))
    with pytest.raises(TinyMTError, match="valid_size"):
        prepare(data_cfg(source="tsv", path=str(path), valid_size=5, test_size=5), log=_quiet)
    with pytest.raises(TinyMTError, match="file not found"):
        prepare(data_cfg(source="tsv", path=str(tmp_path / "no.tsv")), log=_quiet)


# ----------------------------------------------------------------------------------------
# hub source (a local folder in hub layout; a hub name while offline)


def _write_jsonl(folder, splits, translation=False):
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        with open(folder / f"{split}.jsonl", "w") as f:
            for de, en in pairs:
                row = {"translation": {"de": de, "en": en}} if translation else {"en": en, "de": de}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return folder


@pytest.mark.parametrize("translation", [False, True])
def test_hub_layout_local_folder(tmp_path, data_cfg, translation):
    folder = _write_jsonl(
        tmp_path / "hub",
        {"train": make_pairs(200), "validation": make_pairs(12, 1), "test": make_pairs(8, 2)},
        translation=translation,
    )
    d = prepare(data_cfg(source="hub", path=str(folder), valid_split="validation"), log=_quiet)
    assert d.stats["pairs"] == {"train": 200, "valid": 12, "test": 8}
    assert d.splits["test"][0]["src"] == make_pairs(8, 2)[0][0]


def test_hub_layout_missing_split_or_column(tmp_path, data_cfg):
    folder = _write_jsonl(
        tmp_path / "hub",
        {"train": make_pairs(50), "validation": make_pairs(5), "test": make_pairs(5)},
    )
    with pytest.raises(TinyMTError, match="no split 'valid'.*valid_split"):
        prepare(data_cfg(source="hub", path=str(folder), valid_split="valid"), log=_quiet)
    with pytest.raises(TinyMTError, match="no column 'fr'.*src_lang"):
        prepare(
            data_cfg(source="hub", path=str(folder), valid_split="validation", src_lang="fr"),
            log=_quiet,
        )


def test_hub_name_offline_fails_fast_with_a_hint(data_cfg):
    t0 = time.time()
    with pytest.raises(TinyMTError) as e:
        prepare(data_cfg(source="hub", path="tinymt-test/no-such-dataset"), log=_quiet)
    assert time.time() - t0 < 10
    assert "point data.path at a local copy" in str(e.value)
    assert "tinymt-test/no-such-dataset" in str(e.value)


def test_hub_local_looking_path_that_does_not_exist(tmp_path, data_cfg):
    """A folder that is not there is tried as a hub name: datasets' own words name it."""
    gone = tmp_path / "gone" / "x"
    with pytest.raises(TinyMTError, match="point data.path at a local copy") as e:
        prepare(data_cfg(source="hub", path=str(gone)), log=_quiet)
    assert str(gone) in str(e.value)


# ----------------------------------------------------------------------------------------
# builtin source


def test_builtin_source_with_alignments(data_cfg):
    cfg = data_cfg(
        source="builtin",
        src_lang="zh",
        tgt_lang="en",
        train_size=2000,
        valid_size=50,
        test_size=50,
        vocab_size=1000,
    )
    d = prepare(cfg, log=_quiet)
    assert d.stats["pairs"]["valid"] == 50 and d.stats["pairs"]["test"] == 50
    row = d.splits["valid"][0]
    assert {"src_words", "tgt_words", "alignment"} <= set(row)
    for s, t in row["alignment"]:
        assert 0 <= s < len(row["src_words"]) and 0 <= t < len(row["tgt_words"])
    rev = {k: v[0] for k, v in load_columns(data_cfg(**{**cfg.__dict__, "reverse": True}),
                                            _quiet)["valid"].items()}
    fwd = {k: v[0] for k, v in load_columns(cfg, _quiet)["valid"].items()}
    assert rev["src"] == fwd["tgt"]
    assert list(rev["src_words"]) == list(fwd["tgt_words"])
    assert [list(a) for a in rev["alignment"]] == [[t, s] for s, t in fwd["alignment"]]
    # relations are per side: reversing swaps the two lists, each (relation, dep, head)
    # still indexes its own side's words
    assert rev["src_relations"] == fwd["tgt_relations"]
    assert rev["tgt_relations"] == fwd["src_relations"]
    assert fwd["src_relations"]  # the Chinese side has relations
    for _rel, dep, head in row["src_relations"]:
        assert dep < len(row["src_words"]) and head < len(row["src_words"])


def raw_splits(cfg) -> dict:
    """The raw corpus of ``cfg`` per split as the Arrow datasets the pipeline builds (lists
    where the generator has tuples): no normalisation, no tokenization."""
    return {name: datasets.Dataset(as_table(cols))
            for name, cols in load_columns(cfg, _quiet).items()}


def test_builtin_en_to_zh_alignment_pairs_are_en_zh(data_cfg):
    sizes = {"source": "builtin", "train_size": 300, "valid_size": 20, "test_size": 20}
    en_zh = raw_splits(data_cfg(src_lang="en", tgt_lang="zh", **sizes))
    zh_en = raw_splits(data_cfg(src_lang="zh", tgt_lang="en", **sizes))
    for split in ("train", "valid", "test"):
        a, b = en_zh[split].to_dict(), zh_en[split].to_dict()
        assert a["src"] == b["tgt"] and a["src_words"] == b["tgt_words"]
        assert a["alignment"] == [[[t, s] for s, t in sent] for sent in b["alignment"]]
        assert a["src_relations"] == b["tgt_relations"]
        assert a["tgt_relations"] == b["src_relations"]
    row = en_zh["valid"][0]  # en -> zh: alignment pairs are (en_i, zh_i)
    assert "".join(row["tgt_words"]) == row["tgt"]
    assert " " in row["src"] and " " not in row["tgt"]


def test_builtin_rejects_other_languages(data_cfg):
    with pytest.raises(TinyMTError, match="zh and en"):
        prepare(data_cfg(source="builtin", src_lang="de", tgt_lang="en"), log=_quiet)


# ----------------------------------------------------------------------------------------
# the reference corpora in ../shared/data (skipped when absent)


@pytest.mark.slow
def test_shared_multi30k_hub_layout(shared_data, data_cfg):
    d = prepare(
        data_cfg(
            source="hub",
            path=str(shared_data / "multi30k-hub-layout"),
            valid_split="validation",
            vocab_size=1000,
            max_len_ratio=0,
        ),
        log=_quiet,
    )
    assert d.stats["pairs"] == {"train": 29000, "valid": 1014, "test": 1000}
    assert d.splits["train"][0]["src"].startswith("Zwei junge weiße Männer")


@pytest.mark.slow
def test_shared_multi30k_text_files(shared_data, data_cfg):
    d = prepare(
        data_cfg(
            source="text",
            path=str(shared_data / "multi30k"),
            valid_split="val",
            test_split="test_2016_flickr",
            vocab_size=1000,
            max_len_ratio=0,
        ),
        log=_quiet,
    )
    assert d.stats["pairs"] == {"train": 29000, "valid": 1014, "test": 1000}


@pytest.mark.slow
def test_shared_tatoeba(shared_data, data_cfg):
    d = prepare(
        data_cfg(
            source="tsv",
            path=str(shared_data / "tatoeba-cmn-eng" / "cmn-eng.tsv.gz"),
            src_lang="zh",
            tgt_lang="en",
            src_column=1,
            tgt_column=0,
            valid_size=1000,
            test_size=1000,
            vocab_size=4000,
            character_coverage=0.9995,
        ),
        log=_quiet,
    )
    p = d.stats["pairs"]
    assert p["valid"] == 1000 and p["test"] == 1000 and p["train"] > 26000
    assert not d.splits["train"][0]["src"].startswith("\ufeff")
    assert any("\u4e00" <= ch <= "\u9fff" for ch in d.splits["train"][0]["src"])


# ----------------------------------------------------------------------------------------
# scripts/prepare_data.py


def test_script_summary_and_one_line_error(tmp_path, text_corpus, monkeypatch, capsys):
    common = [
        "data=text_files",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.src_lang=de",
        "data.tgt_lang=en",
        "data.vocab_size=40",
    ]
    monkeypatch.chdir(tmp_path)
    status, stderr = run_script_in_process("prepare_data", [*common, f"data.path={text_corpus}"],
                                           capsys)
    out = capsys.readouterr().out
    assert status == 0, stderr
    assert "split" in out and "pairs" in out and "300" in out and "40 joint" in out
    status, stderr = run_script_in_process(
        "prepare_data", [*common, f"data.path={tmp_path / 'missing'}"], capsys)
    assert status == 2
    err = stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "missing" in err[0]
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "corpus"]  # no litter


def test_ragged_ids_read_rows_of_every_chunk_as_arrow_does():
    """PreparedData.ids: rows straight from Arrow's offsets, over several chunks, one of
    them a slice (its offsets start inside the values), compared with Arrow's own lists."""
    rows = [[5, 6, 7], [], [8], [9, 10], [11, 12, 13, 14], [15]]
    whole = pa.array(rows, type=pa.list_(pa.int32()))
    column = pa.chunked_array([whole.slice(0, 2), whole.slice(2, 0), whole.slice(2, 4)])
    ragged = Ragged(column)
    assert len(ragged) == 6 and list(ragged) == column.to_pylist()
    assert [ragged[i] for i in range(6)] == rows and ragged[-1] == [15]
    assert ragged[1:5] == rows[1:5] and ragged[::-2] == rows[::-2]
    assert ragged.lengths().tolist() == [3, 0, 1, 2, 4, 1]
    with pytest.raises(IndexError):
        ragged[6]
    assert len(Ragged(pa.chunked_array([], type=pa.list_(pa.int32())))) == 0


def test_a_streamed_build_is_the_whole_corpus_build(tmp_path, data_cfg, monkeypatch):
    """Chunks of 7 pairs (a 300-pair split crosses 42 boundaries) give what tokenizing the
    corpus whole gives: the same tokenizer as one trained on every normalised train
    sentence in order, each sentence's ids, the same empty / max_len / ratio drops and the
    same stats. The reference is written here plainly, pair by pair."""
    pairs = make_pairs(300, 0)
    pairs[5] = ("  ", "a .")  # empty after normalisation: dropped
    pairs[9] = (" ".join(["der"] * 30) + " .", "the .")  # long and lopsided
    pairs[11] = ("ein\u3000Hund", "ａ ｄｏｇ")  # NFKC + whitespace
    corpus = write_text_corpus(tmp_path / "corpus", {"train": pairs, "valid": make_pairs(20, 1),
                                                     "test": make_pairs(20, 2)})
    cfg = data_cfg(path=str(corpus), max_len=20, max_len_ratio=2.5, vocab_size=60)
    monkeypatch.setattr(tinymt.data.sources, "CHUNK_PAIRS", 7)
    data = prepare(cfg, log=_quiet)

    norm = [(normalize(s), normalize(t)) for s, t in pairs]
    kept = [p for p in norm if p[0] and p[1]]
    reference = Tokenizer.train([s for s, _ in kept] + [t for _, t in kept],
                                tmp_path / "ref" / "spm.model", vocab_size=60)
    assert tokenizer_digest(reference, reference) == tokenizer_digest(data.src_tokenizer,
                                                                    data.src_tokenizer)
    encoded = [(s, t, reference.encode(s), reference.encode(t)) for s, t in kept]
    short = [e for e in encoded if len(e[2]) <= 20 and len(e[3]) <= 20]
    final = [e for e in short if max(len(e[2]), len(e[3])) <=
             2.5 * max(1, min(len(e[2]), len(e[3])))]
    train = data.splits["train"]
    assert train["src"][:] == [e[0] for e in final] and train["tgt"][:] == [e[1] for e in final]
    assert list(data.ids("train")[0]) == [e[2] for e in final]
    assert list(data.ids("train")[1]) == [e[3] for e in final]
    assert data.stats["dropped"]["train"] == {
        "empty": 1, "max_len": len(encoded) - len(short), "max_len_ratio": len(short) - len(final)}
    assert data.stats["dropped"]["train"]["max_len"] >= 1
    lens = [len(e[3]) for e in final]
    assert data.stats["tokens"]["train"]["tgt"]["max"] == max(lens)
    assert data.stats["tokens"]["train"]["tgt"]["mean"] == pytest.approx(sum(lens) / len(lens))
    assert data.stats["pairs"] == {"train": len(final), "valid": 20, "test": 20}


def test_a_split_is_written_as_save_to_disk_writes_it(tmp_path):
    """SplitWriter (chunk by chunk, nothing memory-mapped) against datasets' save_to_disk
    of the same table: the same JSON files (the fingerprint aside), the same data read
    back by load_from_disk. Fails when a datasets release changes its layout."""
    cols = {"src": ["ein Hund", "zwei", "drei Katzen"], "tgt": ["a dog", "two", "three cats"],
            "src_words": [["ein", "Hund"], ["zwei"], ["drei", "Katzen"]],
            "alignment": [[[0, 0], [1, 1]], [[0, 0]], [[0, 0], [1, 1]]],
            "src_ids": [[5, 6], [7], [8, 9]], "tgt_ids": [[10, 11], [12], [13, 14]]}
    table = as_table(cols)
    out = SplitWriter(tmp_path / "ours", "train")
    out.write({name: values[:2] for name, values in cols.items()})
    out.write({name: values[2:] for name, values in cols.items()})
    out.close()
    ours, theirs = tmp_path / "ours" / "splits" / "train", tmp_path / "theirs"
    datasets.Dataset(table).save_to_disk(str(theirs))
    assert (ours / "dataset_info.json").read_bytes() == (theirs / "dataset_info.json").read_bytes()
    state = {k: v for k, v in json.loads((ours / "state.json").read_text()).items()
             if k != "_fingerprint"}
    assert state == {k: v for k, v in json.loads((theirs / "state.json").read_text()).items()
                     if k != "_fingerprint"}
    a, b = datasets.load_from_disk(str(ours)), datasets.load_from_disk(str(theirs))
    assert a.features == b.features and a.with_format("arrow")[:].equals(b.with_format("arrow")[:])


def test_a_data_folder_changing_while_it_is_read_is_one_line(tmp_path, monkeypatch):
    """The cache key of a local hub-layout folder lists its files: one removed between the
    listing and its stat is one line naming it, not an internal error; a hub name (no such
    folder) and a folder at rest are keyed as before."""
    import os
    from pathlib import Path

    from omegaconf import OmegaConf

    from tinymt.config import DataConfig

    folder = tmp_path / "corpus"
    (folder / "data").mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        (folder / "data" / name).write_text("{}\n")
    cfg = OmegaConf.structured(DataConfig(name="x", source="hub", path=str(folder),
                                          cache_dir=str(tmp_path / "cache")))
    assert cache_path(cfg) == cache_path(cfg)  # at rest: the same key twice
    hub = OmegaConf.merge(cfg, {"path": "someone/dataset"})
    assert cache_path(hub) != cache_path(cfg)
    real_stat, seen = os.stat, []

    def stat(path, *args, **kwargs):  # test.jsonl removed after it was found to be a file
        if Path(path).name == "test.jsonl":
            seen.append(path)
            if len(seen) > 1:
                raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    with pytest.raises(TinyMTError, match=f"data.path={folder} changed while it was read "
                                          r"\(.*test.jsonl is gone\)"):
        cache_path(cfg)
