"""What the benchmark runs on: Multi30k (or the built-in corpus), the model sizes of
``configs/model/``, and the pair of models (ours, the peer) with the same weights."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tinymt.bench.machine import REPO_ROOT
from tinymt.bench.measure import log
from tinymt.bench.peer import PeerTransformer
from tinymt.config import DataConfig, ModelConfig
from tinymt.data import PreparedData, prepare
from tinymt.errors import TinyMTError
from tinymt.model import Transformer

DEFAULT_DATA = "multi30k-hub-layout"


def data_folder(data_path: str | None) -> Path:
    if data_path:
        return Path(data_path)
    env = os.environ.get("TINYMT_SHARED_DATA")
    base = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    return base / DEFAULT_DATA


def _quiet(msg: str) -> None:
    log(f"  {msg}")


def load_data(data_path: str | None, cache_dir: str, quick: bool) -> tuple[PreparedData, dict]:
    """Multi30k de->en through ``tinymt.data.prepare``, or the built-in corpus; and the
    data section of the results."""
    folder = data_folder(data_path)
    if folder.is_dir():
        # the path as the configs spell it (relative to the repo root) so that the prepared
        # cache of `data=multi30k data.path=../shared/...` is reused
        path = os.path.relpath(folder.resolve(), REPO_ROOT) if folder.is_absolute() else str(folder)
        cfg = DataConfig(name="multi30k", source="hub", path=path, src_lang="de", tgt_lang="en",
                         train_split="train", valid_split="validation", test_split="test",
                         vocab_size=8000, cache_dir=cache_dir)
        data = prepare(cfg, log=_quiet)
        note = None
        name = f"Multi30k de→en (`{path}`), joint BPE 8000"
    else:
        train_size = 3000 if quick else 30000
        cfg = DataConfig(name="builtin_zh_en", source="builtin", src_lang="zh", tgt_lang="en",
                         train_size=train_size, valid_size=10, test_size=1000, vocab_size=2000,
                         cache_dir=cache_dir)
        data = prepare(cfg, log=_quiet)
        note = (f"Multi30k not found at `{folder}`: measured on the built-in zh→en corpus "
                f"instead ({train_size} training pairs, joint BPE 2000), so the numbers are "
                "not comparable with Multi30k ones (shorter sentences, smaller vocabulary)")
        name = f"built-in zh→en corpus, joint BPE 2000 (fallback: {folder} absent)"
    train_lens = data.lengths("train")
    return data, {"name": name, "note": note, "train_pairs": len(train_lens[0]),
                  "test_pairs": len(data.lengths("test")[0]),
                  "vocab": [data.src_tokenizer.vocab_size, data.tgt_tokenizer.vocab_size],
                  "shared_vocab": data.src_tokenizer is data.tgt_tokenizer}


def model_config(size: str) -> ModelConfig:
    """``configs/model/<size>.yaml`` over the ``ModelConfig`` defaults."""
    path = REPO_ROOT / "configs" / "model" / f"{size}.yaml"
    if not path.is_file():
        sizes = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise TinyMTError(f"--sizes: no model size {size!r} (configs/model/ has {sizes})")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                               OmegaConf.load(path)))


def build_pair(cfg: ModelConfig, data_info: dict, device: torch.device
               ) -> tuple[Transformer, PeerTransformer]:
    """Our model and the peer with the same weights."""
    src_v, tgt_v = data_info["vocab"]
    torch.manual_seed(0)
    ours = Transformer(cfg, src_v, tgt_v, shared_vocab=data_info["shared_vocab"])
    return ours.to(device), PeerTransformer.copy_of(ours).to(device)
