"""Sentencepiece wrapper: fixed special ids, no bos/eos in encode, joint/separate save/load."""

import pickle
import re

import pytest
import torch
from sentencepiece import sentencepiece_model_pb2 as spm_pb

from conftest import make_pairs
from tinymt.errors import TinyMTError
from tinymt.tokenizer import Tokenizer, load_tokenizers, save_tokenizers


def model_type(t: Tokenizer) -> int:
    proto = spm_pb.ModelProto()
    proto.ParseFromString(t.sp.serialized_model_proto())
    return proto.trainer_spec.model_type


@pytest.fixture(scope="module")
def sentences():
    return [s for pair in make_pairs(300) for s in pair]


@pytest.fixture(scope="module")
def tok(sentences, tmp_path_factory):
    return Tokenizer.train(sentences, tmp_path_factory.mktemp("tok") / "spm.model", vocab_size=48)


def test_special_ids_are_fixed(tok):
    assert model_type(tok) == spm_pb.TrainerSpec.BPE  # the default
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.vocab_size == 48
    assert tok.model_path.name == "spm.model" and tok.model_path.is_file()


def test_encode_has_no_bos_eos_and_round_trips(tok):
    text = "der hund sieht die katze ."
    ids = tok.encode(text)
    assert ids and not {0, 2, 3} & set(ids)
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, "ein baum ."]) == [ids, tok.encode("ein baum .")]
    assert tok.encode_batch([]) == []


def test_decode_stops_at_eos_and_drops_pad_and_bos(tok):
    ids = tok.encode("der hund .")
    assert tok.decode([2] + ids + [3] + tok.encode("katze") + [0, 0]) == "der hund ."
    assert tok.decode(torch.tensor([2] + ids + [0])) == "der hund ."
    assert tok.decode([3]) == ""


def test_unknown_characters_map_to_unk(tok):
    assert tok.unk_id in tok.encode("der 狗 .")


def test_pieces_label_every_id(tok):
    ids = tok.encode("der hund")
    pieces = tok.pieces(ids)
    assert len(pieces) == len(ids)  # one label per id, for the attention-map axes
    assert pieces == [tok.sp.id_to_piece(i) for i in ids]
    assert "".join(pieces).replace("▁", " ").strip() == "der hund"


def test_unigram_model(sentences, tmp_path):
    t = Tokenizer.train(sentences, tmp_path / "u.model", vocab_size=40, model_type="unigram")
    assert model_type(t) == spm_pb.TrainerSpec.UNIGRAM  # not the default bpe
    assert t.decode(t.encode("das haus ist rot")) == "das haus ist rot"
    assert t.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]


def test_vocab_too_large_says_what_to_lower_it_to(sentences, tmp_path):
    with pytest.raises(TinyMTError) as e:
        Tokenizer.train(sentences, tmp_path / "big.model", vocab_size=5000)
    msg = str(e.value)
    m = re.search(r"data\.vocab_size=5000 does not suit .*set it to a value <= (\d+)", msg)
    assert m and "\n" not in msg, msg
    # and the suggested value does work
    bound = int(m.group(1))
    assert Tokenizer.train(sentences, tmp_path / "ok.model", vocab_size=bound).vocab_size == bound


def test_save_load_joint_is_one_model(tok, tmp_path):
    save_tokenizers(tmp_path / "t", tok, tok)
    assert sorted(p.name for p in (tmp_path / "t").glob("*.model")) == ["spm.model"]
    src, tgt = load_tokenizers(tmp_path / "t")
    assert src is tgt
    assert src.encode("der hund") == tok.encode("der hund")


def test_save_load_separate(sentences, tmp_path):
    src = Tokenizer.train(sentences[0::2], tmp_path / "a" / "src.model", vocab_size=30)
    tgt = Tokenizer.train(sentences[1::2], tmp_path / "a" / "tgt.model", vocab_size=32)
    save_tokenizers(tmp_path / "t", src, tgt)
    assert sorted(p.name for p in (tmp_path / "t").glob("*.model")) == ["src.model", "tgt.model"]
    s, t = load_tokenizers(tmp_path / "t")
    assert s is not t and (s.vocab_size, t.vocab_size) == (30, 32)


def test_load_missing_folder_or_files(tmp_path):
    with pytest.raises(TinyMTError, match="no tokenizer in .*nope") as e:
        load_tokenizers(tmp_path / "nope")
    assert "spm.model" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TinyMTError) as e:
        load_tokenizers(tmp_path / "empty")
    assert "spm.model" in str(e.value) and "src.model" in str(e.value)
    with pytest.raises(TinyMTError, match="missing.model is not a sentencepiece model .*No such"):
        Tokenizer.load(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(TinyMTError, match="not a sentencepiece model"):
        Tokenizer.load(tmp_path / "junk.model")


def test_pickles(tok):
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode("die katze läuft") == tok.encode("die katze läuft")
    assert clone.model_path == tok.model_path
