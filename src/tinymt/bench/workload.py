"""What the benchmark runs on: Multi30k (or the built-in corpus), the model sizes of
``configs/model/``, and the pair of models (ours, the peer) with the same weights."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tinymt.bench.measure import REPO_ROOT, log
from tinymt.bench.peer import PeerTransformer
from tinymt.config import DataConfig, ModelConfig, as_typed
from tinymt.data import PreparedData, prepare
from tinymt.model import Transformer


def load_data(data_path: str | None, cache_dir: str, quick: bool) -> tuple[PreparedData, dict]:
    """Multi30k de->en through ``tinymt.data.prepare`` (the trainer's cache), or the built-in
    corpus where Multi30k is absent; and how the report names it."""
    shared = os.environ.get("TINYMT_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data"
    folder = Path(data_path or Path(shared) / "multi30k-hub-layout")
    if folder.is_dir():  # spelled as the configs spell it, so the trainer's cache is reused
        path = os.path.relpath(folder.resolve(), REPO_ROOT) if folder.is_absolute() else str(folder)
        cfg = DataConfig(name="multi30k", source="hub", path=path, src_lang="de", tgt_lang="en",
                         vocab_size=8000, cache_dir=cache_dir)
        name = f"Multi30k de→en (`{path}`), joint BPE 8000"
    else:
        size = 3000 if quick else 30000
        cfg = DataConfig(train_size=size, valid_size=10, test_size=1000, cache_dir=cache_dir)
        name = (f"the built-in zh→en corpus ({size:,} training pairs, joint BPE 2000): "
                f"Multi30k not found at `{folder}`, so not comparable with Multi30k figures")
    data = prepare(cfg, log=lambda msg: log(f"  {msg}"))
    return data, {"name": name, "train_pairs": len(data.lengths("train")[0]),
                  "test_pairs": len(data.lengths("test")[0]),
                  "vocab": [data.src_tokenizer.vocab_size, data.tgt_tokenizer.vocab_size],
                  "shared_vocab": data.src_tokenizer is data.tgt_tokenizer}


def model_config(size: str) -> ModelConfig:
    """``configs/model/<size>.yaml`` over the ``ModelConfig`` defaults."""
    path = REPO_ROOT / "configs" / "model" / f"{size}.yaml"  # (a name of --sizes' choices)
    return OmegaConf.to_object(as_typed(ModelConfig, OmegaConf.load(path)))


def build_pair(cfg: ModelConfig, data_info: dict, device: torch.device
               ) -> tuple[Transformer, PeerTransformer]:
    """Our model (seed 0) and the peer holding the same weights."""
    torch.manual_seed(0)
    ours = Transformer(cfg, *data_info["vocab"], shared_vocab=data_info["shared_vocab"])
    return ours.to(device), PeerTransformer(ours).to(device)
