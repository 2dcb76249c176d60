"""Checkpoints: published atomically, loaded without running code, averaged.

A checkpoint is one ``torch.save`` dict of tensors and plain containers only
(dicts, lists, tuples, strings, numbers, None):

    {"format": 2, "model": state_dict, "model_config": {...}, "vocab": {...},
     "step": int, "config": {...full resolved config...}, ...training state...}

**Publishing** (:func:`save_checkpoint`): through :func:`tinymt.files.write_file`, the
one write path (a locked temp file beside it, fsync, rename): a run killed mid-save leaves
the previous checkpoint intact; a failed write (disk full) removes its temp file and says
so in one line.

**Loading** (:func:`load_checkpoint`) is the one checked loader of every ``.pt``: a
regular file of at most :data:`MAX_CHECKPOINT_BYTES`, a zip archive as ``torch.save``
writes it (its directory read first), ``torch.load(weights_only=True)`` (a file that
carries any other pickled object, which could run code when unpickled, is refused before
anything in it runs; junk bytes are *damaged*, never that), then every field's type,
range and shape (:func:`schema_problem`). Each refusal is one line naming the file and,
for a field, the field.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tinymt.config import ModelConfig, estimated_parameters
from tinymt.errors import TinyMTError
from tinymt.files import regular_file, write_file
from tinymt.rules import MAX_COUNT, MAX_PARAMETERS, MAX_VOCAB, rules_of

FORMAT = 2
# a model of MAX_PARAMETERS float32 weights and AdamW's two moments, with room to spare:
# a larger file is refused by its size, before it is read
MAX_CHECKPOINT_BYTES = 2**34
MAX_ENTRIES = 200_000  # tensors in a model, entries in a checkpoint's archive
MAX_DEPTH = 16  # nesting of the plain containers (config, training state)
MODEL_RULES = rules_of(ModelConfig)  # every key the model reads, and its values' rule
MODEL_FLAGS = ("norm_first", "tie_embeddings")
TRAINING_STATE = ("trainer_state", "optimizer", "scheduler", "sampler", "rng")
# torch's weights_only refusals of an object that is not a tensor or plain container (the
# others, "Unsupported operand" and the like, are bytes that do not parse: damage)
_CODE_WORDS = ("Unsupported global", "is blocked", "must be imported")
_SCALARS = (type(None), bool, int, float, str)


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike,
                    owner: str | os.PathLike | None = None) -> None:
    """Publish ``state`` at ``path`` (:func:`tinymt.files.write_file`: temp file, fsync,
    rename; ``owner``: the run this process holds, when ``path`` is inside it)."""
    write_file(path, lambda f: torch.save({**state, "format": FORMAT}, f), owner=owner)


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (what a published file is checked by)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint`, checked, or raise one line
    naming the file (and the field, when a field is wrong).

    In this order, each step before anything later reads the file: a regular file (never
    opened otherwise: a pipe would block), at most :data:`MAX_CHECKPOINT_BYTES`; a zip
    archive as ``torch.save`` writes it (entries stored, not compressed, none larger than
    the file: a small file cannot unpack into a large one); unpickled with
    ``weights_only=True`` (tensors and plain containers only: anything else is refused,
    never executed); then every field's type, range and shape (:func:`schema_problem`).
    """
    path = regular_file(path, "checkpoint")
    _check_archive(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if any(word in str(e) for word in _CODE_WORDS):
            raise TinyMTError(
                f"{path} holds objects other than tensors and plain containers; it was not "
                "loaded (loading it could run code). Use a checkpoint written by tinymt"
            ) from None
        raise _damaged(path, "its pickle does not parse") from None
    except MemoryError:
        raise TinyMTError(f"out of memory while loading the checkpoint {path}") from None
    except Exception as e:  # noqa: BLE001  (junk bytes reach torch's unpickler: any error)
        raise _damaged(path, type(e).__name__) from None
    if not isinstance(state, dict) or "model" not in state:
        raise TinyMTError(f"checkpoint {path} is not a tinymt checkpoint (no model in it)")
    if state.get("format") != FORMAT:
        found = state.get("format")
        shown = repr(found) if isinstance(found, (int, str, type(None))) else type(found).__name__
        raise TinyMTError(f"{path} has checkpoint format {shown[:40]}, this tinymt reads "
                          f"format {FORMAT}: retrain, or translate with the tinymt version "
                          "that wrote it")
    problem = schema_problem(state)
    if problem:
        raise TinyMTError(f"checkpoint {path} is not one tinymt wrote: {problem}; use another "
                          "checkpoint of the run (last.pt / best.pt)")
    return state


def _damaged(path: Path, why: str) -> TinyMTError:
    return TinyMTError(f"checkpoint {path} is damaged or truncated, or not a checkpoint ({why}); "
                       "use another checkpoint of the run (last.pt / best.pt)")


def _check_archive(path: Path) -> None:
    """The zip archive ``torch.save`` writes: its directory read (nothing unpacked), every
    entry stored whole and within the file. Junk, a truncated file, a compressed entry (a
    "zip bomb") or an entry declaring more bytes than the file holds are refused here."""
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise TinyMTError(f"checkpoint {path} is {size:,} bytes, more than any checkpoint "
                          f"tinymt writes (at most {MAX_CHECKPOINT_BYTES:,}); not loaded")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except MemoryError:
        raise TinyMTError(f"out of memory while loading the checkpoint {path}") from None
    except Exception as e:  # noqa: BLE001  (BadZipFile, struct/Value/OverflowError on junk)
        why = "not a zip archive" if isinstance(e, zipfile.BadZipFile) else type(e).__name__
        raise _damaged(path, why) from None
    if not entries or len(entries) > MAX_ENTRIES:
        raise _damaged(path, f"{len(entries):,} entries in its archive")
    for e in entries:
        if e.compress_type != zipfile.ZIP_STORED or e.compress_size != e.file_size:
            raise _damaged(path, f"{_short(e.filename)} is compressed: torch.save stores")
        if e.header_offset + e.file_size > size:
            raise _damaged(path, f"{_short(e.filename)}, {e.file_size:,} bytes at "
                                 f"{e.header_offset:,}, runs past the end of the file")
    if not any(e.filename.endswith("/data.pkl") for e in entries):
        raise _damaged(path, "no data.pkl in its archive")


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


# ----------------------------------------------------------------------------- the schema
def schema_problem(state: dict) -> str | None:
    """What is wrong with a loaded checkpoint's fields, as ``field: problem``; None: nothing.

    ``model`` a dict of names to dense tensors; ``vocab`` ``{src_size, tgt_size: int in
    [4, MAX_VOCAB], shared: bool}``; ``model_config`` plain values within the rules of
    :class:`tinymt.config.ModelConfig` (every key the model reads), and the model's
    tensors of the shapes it and ``vocab`` give; ``step`` an integer >= 0, ``config`` and
    the training state (``trainer_state``, ``optimizer``, ``scheduler``, ``sampler``,
    ``rng``) dicts of plain values, ``tokenizer_sha256`` a string, when present.
    """
    for check in (_model_problem, _vocab_problem, _config_problem, _optional_problem,
                  _shape_problem):
        problem = check(state)
        if problem:
            return problem
    return None


def _model_problem(state: dict) -> str | None:
    model = state["model"]
    if not isinstance(model, dict) or not model:
        return "model: expected a dict of tensors"
    if len(model) > MAX_ENTRIES:
        return f"model: {len(model):,} tensors"
    for name, value in model.items():
        if not isinstance(name, str):
            return f"model: a key of type {type(name).__name__} (expected tensor names)"
        if not isinstance(value, torch.Tensor):
            return f"model.{_name(name)}: expected a tensor, found {type(value).__name__}"
        if value.layout != torch.strided:
            return f"model.{_name(name)}: expected a dense tensor, found {value.layout}"
    return None


def _vocab_problem(state: dict) -> str | None:
    vocab = state.get("vocab")
    if not isinstance(vocab, dict):
        return f"vocab: expected {{src_size, tgt_size, shared}}, found {_kind(vocab)}"
    for key in ("src_size", "tgt_size"):
        if not _is_int(vocab.get(key), 4, MAX_VOCAB):
            return (f"vocab.{key}: expected an integer in [4, {MAX_VOCAB}], found "
                    f"{_shown(vocab.get(key))}")
    if not isinstance(vocab.get("shared"), bool):
        return f"vocab.shared: expected true or false, found {_shown(vocab.get('shared'))}"
    if vocab["shared"] and vocab["src_size"] != vocab["tgt_size"]:
        return "vocab: shared, but src_size and tgt_size differ"
    return None


def _config_problem(state: dict) -> str | None:
    mc = state.get("model_config")
    if not isinstance(mc, dict):
        return f"model_config: expected a dict, found {_kind(mc)}"
    problem = _plain_problem(mc, "model_config", depth=1)
    if problem:
        return problem
    for key, (check, allowed) in MODEL_RULES.items():
        if key not in mc:
            return f"model_config.{key}: missing"
        if check(mc[key]) is not True:
            return f"model_config.{key}={_shown(mc[key])}: {allowed}"
    for key in MODEL_FLAGS:
        if not isinstance(mc.get(key), bool):
            return f"model_config.{key}: expected true or false, found {_shown(mc.get(key))}"
    if mc["d_model"] % mc["n_heads"]:
        return "model_config: d_model is not divisible by n_heads"
    vocab = state["vocab"]
    sizes = SimpleNamespace(model=SimpleNamespace(**mc), data=SimpleNamespace(
        vocab_size=max(vocab["src_size"], vocab["tgt_size"])))
    if estimated_parameters(sizes) > MAX_PARAMETERS:
        return f"model_config: a model of more than {MAX_PARAMETERS:,} parameters"
    return None


def _optional_problem(state: dict) -> str | None:
    if "step" in state and not _is_int(state["step"], 0, MAX_COUNT):
        return f"step: expected an integer in [0, {MAX_COUNT}], found {_shown(state['step'])}"
    digest = state.get("tokenizer_sha256")
    if digest is not None and not (isinstance(digest, str) and len(digest) <= 128):
        return f"tokenizer_sha256: expected a hex digest, found {_kind(digest)}"
    for key in ("config", *TRAINING_STATE):
        if key in state and not (key == "rng" and state[key] is None):
            if not isinstance(state[key], dict):
                return f"{key}: expected a dict, found {_kind(state[key])}"
            problem = _plain_problem(state[key], key, depth=1, tensors=key != "config")
            if problem:
                return problem
    data = (state.get("config") or {}).get("data")
    if data is not None and not isinstance(data, dict):
        return f"config.data: expected a dict, found {_kind(data)}"
    for key in ("name", "source", "src_lang", "tgt_lang"):
        if data and not isinstance(data.get(key), (str, type(None))):
            return f"config.data.{key}: expected a string, found {_kind(data.get(key))}"
    if data and not isinstance(data.get("reverse", False), bool):
        return f"config.data.reverse: expected true or false, found {_kind(data['reverse'])}"
    return None


def _shape_problem(state: dict) -> str | None:
    """The model's tensors have the shapes its ``model_config`` and ``vocab`` say (the
    embeddings, the output projection, the head masks, the layer count, ``d_ff``): a
    config that would build a larger model than the file holds is refused here."""
    mc, vocab, model = state["model_config"], state["vocab"], state["model"]
    d, h = mc["d_model"], mc["n_heads"]
    n_enc, n_dec = mc["n_encoder_layers"], mc["n_decoder_layers"]
    expected = {"src_embed.weight": (vocab["src_size"], d),
                "tgt_embed.weight": (vocab["tgt_size"], d),
                "output_proj.weight": (vocab["tgt_size"], d),
                "head_mask_encoder_self": (n_enc, h), "head_mask_decoder_self": (n_dec, h),
                "head_mask_cross": (n_dec, h)}
    if mc["positional"] == "learned":
        expected.update({f"{side}_pos.embedding.weight": (mc["max_positions"], d)
                         for side in ("src", "tgt")})
    for name, shape in expected.items():
        if name not in model:
            return f"model.{name}: missing"
        if tuple(model[name].shape) != shape:
            return (f"model.{name}: shape {tuple(model[name].shape)}, but model_config and "
                    f"vocab give {shape}")
    for side, n in (("encoder", n_enc), ("decoder", n_dec)):
        layers = {int(m.group(1)) for name in model
                  if (m := re.match(rf"{side}_layers\.(\d+)\.", name))}
        if layers != set(range(n)):
            return (f"model: {len(layers)} {side} layers, but model_config.n_{side}_layers "
                    f"is {n}")
    for name, value in model.items():
        if name.endswith(".ff.linear1.weight") and tuple(value.shape) != (mc["d_ff"], d):
            return (f"model.{name}: shape {tuple(value.shape)}, but model_config gives "
                    f"{(mc['d_ff'], d)}")
    return None


def _plain_problem(value: Any, where: str, depth: int, tensors: bool = False) -> str | None:
    """Plain values only (None, bool, numbers, strings, lists, tuples, dicts with string
    keys; ``tensors``: tensors too), nested at most :data:`MAX_DEPTH` deep."""
    if depth > MAX_DEPTH:
        return f"{where}: nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                return f"{where}: a key of type {type(k).__name__}"
            problem = _plain_problem(v, f"{where}.{_name(str(k))}", depth + 1, tensors)
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            problem = _plain_problem(v, f"{where}[{i}]", depth + 1, tensors)
            if problem:
                return problem
    elif not (isinstance(value, _SCALARS) or tensors and isinstance(value, torch.Tensor)):
        return f"{where}: expected plain values, found {type(value).__name__}"
    return None


def _is_int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _shown(value: Any) -> str:
    if isinstance(value, (bool, int, float, type(None))):
        return repr(value)[:40]
    if isinstance(value, str):
        return _short(value)
    return type(value).__name__


def _name(name: str) -> str:
    """A tensor or key name as a message shows it: one line, at most 60 characters."""
    name = name.encode("unicode_escape").decode("ascii")
    return name if len(name) <= 60 else name[:57] + "..."


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict:
    """Average the model weights of several checkpoints of one run.

    Returns the last checkpoint's dict with its ``model`` replaced by the mean of all
    (integer buffers are taken from the last one). Optimizer state is dropped: the
    result is for translation, not for resuming. Every checkpoint must be of the same model
    and tokenizer (``tokenizer_sha256``, ``vocab``, ``model_config``, every tensor's shape
    and dtype): anything else is refused in one line naming the file and what differs.
    """
    if not paths:
        raise TinyMTError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    for p, s in zip(paths, states):
        if not isinstance(s["model"], dict) or not all(
                isinstance(v, torch.Tensor) for v in s["model"].values()):
            raise TinyMTError(f"{p} is not a tinymt checkpoint (its model is not a dict of "
                              "tensors)")
    for p, s in zip(paths[:-1], states):
        why = _differs(s, states[-1])
        if why:
            raise TinyMTError(f"{p} is from a different model or tokenizer than {paths[-1]}: "
                              f"{why}; cannot average (only checkpoints of one run)")
    keys = states[-1]["model"].keys()
    averaged = {}
    for k in keys:
        last = states[-1]["model"][k]
        if last.is_floating_point():
            averaged[k] = sum(s["model"][k].double() for s in states).div(len(states)).to(last.dtype)
        else:
            averaged[k] = last
    out = {k: v for k, v in states[-1].items()
           if k not in ("optimizer", "scheduler", "rng", "sampler")}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    return out


def _differs(state: dict, ref: dict) -> str | None:
    """What makes ``state`` another model or tokenizer than ``ref`` (None: nothing)."""
    def short(v):
        return f"{v[:12]}..." if isinstance(v, str) and len(v) > 12 else repr(v)

    if state.get("tokenizer_sha256") != ref.get("tokenizer_sha256"):
        return (f"its tokenizer differs (tokenizer_sha256 {short(state.get('tokenizer_sha256'))}"
                f" vs {short(ref.get('tokenizer_sha256'))})")
    if state.get("vocab") != ref.get("vocab"):
        return f"its vocab differs ({state.get('vocab')} vs {ref.get('vocab')})"
    if state.get("model_config") != ref.get("model_config"):
        a, b = state.get("model_config") or {}, ref.get("model_config") or {}
        if not isinstance(a, dict) or not isinstance(b, dict):
            return "its model_config differs"
        keys = sorted(k for k in {*a, *b} if a.get(k, "<unset>") != b.get(k, "<unset>"))
        return "its model_config differs (" + ", ".join(
            f"{k}={a.get(k, '<unset>')!r} vs {b.get(k, '<unset>')!r}" for k in keys[:3]) + \
            (", ..." if len(keys) > 3 else "") + ")"
    mine, theirs = state["model"], ref["model"]
    if mine.keys() != theirs.keys():
        extra, missing = sorted(mine.keys() - theirs.keys()), sorted(theirs.keys() - mine.keys())
        return ("its model has other tensors ("
                + ", ".join([*(f"+{k}" for k in extra[:2]), *(f"-{k}" for k in missing[:2])])
                + ")")
    for k, v in theirs.items():
        if mine[k].shape != v.shape or mine[k].dtype != v.dtype:
            return (f"its tensor {k} is {tuple(mine[k].shape)} {mine[k].dtype} vs "
                    f"{tuple(v.shape)} {v.dtype}")
    return None
