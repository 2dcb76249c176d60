"""Checkpoints: published atomically, loaded without running code (the one checked loader
of every ``.pt``), averaged. A checkpoint is one ``torch.save`` dict of tensors and plain
containers only (dicts, lists, tuples, strings, numbers, None):

    {"format": 2, "model": state_dict, "model_config": {...}, "vocab": {...},
     "step": int, "config": {...full resolved config...}, ...training state...}
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

from tinymt.config import (
    MAX_COUNT,
    MAX_PARAMETERS,
    MAX_VOCAB,
    ModelConfig,
    Rule,
    estimated_parameters,
    integer,
    rules_of,
)
from tinymt.errors import TinyMTError
from tinymt.files import regular_file, write_file

FORMAT = 2
# a model of MAX_PARAMETERS float32 weights and AdamW's two moments, with room to spare:
# a larger file is refused by its size, before it is read
MAX_CHECKPOINT_BYTES = 2**34
MAX_ENTRIES = 200_000  # tensors in a model, entries in a checkpoint's archive
MAX_DEPTH = 16  # nesting of the plain containers (config, training state)
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
    """A checkpoint written by :func:`save_checkpoint`, checked in this order, each step
    before anything later reads the file: a regular file (never opened otherwise) of at
    most :data:`MAX_CHECKPOINT_BYTES`; a zip archive as ``torch.save`` writes it
    (:func:`_check_archive`); unpickled with ``weights_only=True`` (anything but tensors
    and plain containers is refused, never executed); every field's type, range and shape
    (:func:`schema_problem`). Else one line naming the file (and the field)."""
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
        raise TinyMTError(f"{path} has checkpoint format {_shown(state.get('format'))}, this "
                          f"tinymt reads format {FORMAT}: retrain, or translate with the "
                          "tinymt version that wrote it")
    problem = schema_problem(state)
    if problem:
        raise TinyMTError(f"checkpoint {path} is not one tinymt wrote: {problem}; use another "
                          "checkpoint of the run (last.pt / best.pt)")
    masks = {key: state["model"].pop(key) for key in HEAD_MASKS if key in state["model"]}
    state["model"] = fold_head_masks(state["model"], masks, state["model_config"]["n_heads"])
    return state


HEAD_MASKS = {"head_mask_encoder_self": ("encoder", "self_attn"),
              "head_mask_decoder_self": ("decoder", "self_attn"),
              "head_mask_cross": ("decoder", "cross_attn")}


def fold_head_masks(model: dict, masks: dict, n_heads: int) -> dict:
    """``model`` (a state dict) with each head's ``W_O`` columns times its mask,
    ``masks``: ``{head_mask_<kind>: (n_layers, h)}``. A head masked 0 is then switched off,
    as a gate of 0 would: how the model holds pruned heads (and how a checkpoint storing
    ``head_mask_*`` tensors is read)."""
    model = dict(model)
    for key, mask in masks.items():
        side, attn = HEAD_MASKS[key]
        for layer, row in enumerate(mask.float()):  # (h,)
            name = f"{side}_layers.{layer}.{attn}.out_proj.weight"
            w = model.get(name)  # (d, h * d_head)
            if not (isinstance(w, torch.Tensor) and w.dim() == 2 and w.size(1) % n_heads == 0):
                continue  # no such layer: loading the state dict names what is missing
            heads = w.reshape(w.size(0), n_heads, w.size(1) // n_heads)  # (d, h, d_head)
            model[name] = (heads * row[:, None].to(w)).reshape(w.shape)
    return model


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
            raise _damaged(path, f"{_shown(e.filename)} is compressed: torch.save stores")
        if e.header_offset + e.file_size > size:
            raise _damaged(path, f"{_shown(e.filename)}, {e.file_size:,} bytes at "
                                 f"{e.header_offset:,}, runs past the end of the file")
    if not any(e.filename.endswith("/data.pkl") for e in entries):
        raise _damaged(path, "no data.pkl in its archive")


# ----------------------------------------------------------------------------- the schema
def _tensors(model: Any) -> bool | str:
    """A dict of (at most :data:`MAX_ENTRIES`) tensor names to dense tensors."""
    if not isinstance(model, dict) or not 0 < len(model) <= MAX_ENTRIES:
        return False
    for name, value in model.items():
        if not isinstance(name, str):
            return f": a key of type {type(name).__name__} (expected tensor names)"
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            found = value.layout if isinstance(value, torch.Tensor) else type(value).__name__
            return f".{_name(name)}: expected a dense tensor, found {found}"
        # the file must hold every weight it describes: a view whose shape outgrows its
        # storage (an expanded or overlapping one) would let a few KB describe a huge model
        if value.untyped_storage().nbytes() < value.numel() * value.element_size():
            return (f".{_name(name)}: shape {tuple(value.shape)} needs "
                    f"{value.numel() * value.element_size():,} bytes, its storage holds "
                    f"{value.untyped_storage().nbytes():,}")
    return True


def _plain_dict(tensors: bool = False, nullable: bool = False) -> Rule:
    """A dict of plain values (``tensors``: tensors too; ``nullable``: or None)."""
    return (lambda v: v is None and nullable or isinstance(v, dict) and (
        _plain_problem(v, "", 1, tensors) or True)), "must be a dict of plain values"


_BOOL: Rule = (lambda v: isinstance(v, bool), "must be true or false")
_TEXT: Rule = (lambda v: isinstance(v, (str, type(None))), "must be a string")
# (field, required, rule), checked in this order (a dict before its keys); an absent field
# that is not required is fine; a rule's text answer is where in the field and what failed
FIELDS: list[tuple[str, bool, Rule]] = [
    ("model", True, (_tensors, f"must be a dict of at most {MAX_ENTRIES:,} tensors")),
    ("vocab", True, (lambda v: isinstance(v, dict), "must be {src_size, tgt_size, shared}")),
    *((f"vocab.{key}", True, integer(4, MAX_VOCAB)) for key in ("src_size", "tgt_size")),
    ("vocab.shared", True, _BOOL),
    ("model_config", True, _plain_dict()),  # every key the model reads, and its rule:
    *((f"model_config.{key}", True, rule) for key, rule in rules_of(ModelConfig).items()),
    ("model_config.norm_first", True, _BOOL), ("model_config.tie_embeddings", True, _BOOL),
    ("step", False, integer(0, MAX_COUNT)),
    ("tokenizer_sha256", False, (lambda v: v is None or isinstance(v, str) and len(v) <= 128,
                                 "must be a hex digest")),
    ("config", False, _plain_dict()),
    *((key, False, _plain_dict(tensors=True, nullable=key == "rng")) for key in TRAINING_STATE),
    ("config.data", False, (lambda v: v is None or isinstance(v, dict), "must be a dict")),
    *((f"config.data.{key}", False, _TEXT) for key in ("name", "source", "src_lang", "tgt_lang")),
    ("config.data.reverse", False, _BOOL),
]
_ABSENT = object()


def schema_problem(state: dict) -> str | None:
    """What is wrong with a loaded checkpoint's fields (:data:`FIELDS`, the rules between
    them, the shapes of the model's tensors), as ``field: problem``; None: nothing."""
    for key, required, (check, allowed) in FIELDS:
        value = state
        for part in key.split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT:
            if required:
                return f"{key}: missing"
            continue
        verdict = check(value)
        if verdict is not True:
            return key + verdict if isinstance(verdict, str) else \
                f"{key}={_shown(value)}: {allowed}"
    return _cross_problem(state) or _shape_problem(state)


def _cross_problem(state: dict) -> str | None:
    vocab, mc = state["vocab"], state["model_config"]
    if vocab["shared"] and vocab["src_size"] != vocab["tgt_size"]:
        return "vocab: shared, but src_size and tgt_size differ"
    if mc["d_model"] % mc["n_heads"]:
        return "model_config: d_model is not divisible by n_heads"
    sizes = SimpleNamespace(model=SimpleNamespace(**{k: v for k, v in mc.items() if k in (
        "d_model", "d_ff", "max_positions", "n_encoder_layers", "n_decoder_layers")}),
        data=SimpleNamespace(vocab_size=max(vocab["src_size"], vocab["tgt_size"])))
    if estimated_parameters(sizes) > MAX_PARAMETERS:
        return f"model_config: a model of more than {MAX_PARAMETERS:,} parameters"
    return None


def _shape_problem(state: dict) -> str | None:
    """The model's tensors have the shapes its ``model_config`` and ``vocab`` say (the
    embeddings, the output projection, any head masks, the layer count, ``d_ff``): a
    config that would build a larger model than the file holds is refused here."""
    mc, vocab, model = state["model_config"], state["vocab"], state["model"]
    d, h = mc["d_model"], mc["n_heads"]
    n_enc, n_dec = mc["n_encoder_layers"], mc["n_decoder_layers"]
    expected = {"src_embed.weight": (vocab["src_size"], d),
                "tgt_embed.weight": (vocab["tgt_size"], d),
                "output_proj.weight": (vocab["tgt_size"], d)}
    expected.update({key: (n_enc if side == "encoder" else n_dec, h)
                     for key, (side, _) in HEAD_MASKS.items() if key in model})
    if mc["positional"] == "learned":
        expected.update({f"{side}_pos.embedding.weight": (mc["max_positions"], d)
                         for side in ("src", "tgt")})
    expected.update({k: (mc["d_ff"], d) for k in model if k.endswith(".ff.linear1.weight")})
    for name, shape in expected.items():
        if name not in model:
            return f"model.{name}: missing"
        if tuple(model[name].shape) != shape:
            return (f"model.{_name(name)}: shape {tuple(model[name].shape)}, but model_config "
                    f"and vocab give {shape}")
    for side, n in (("encoder", n_enc), ("decoder", n_dec)):
        layers = {int(m.group(1)) for name in model
                  if (m := re.match(rf"{side}_layers\.(\d+)\.", name))}
        if layers != set(range(n)):
            return (f"model: {len(layers)} {side} layers, but model_config.n_{side}_layers "
                    f"is {n}")
    return None


def _plain_problem(value: Any, where: str, depth: int, tensors: bool = False) -> str | None:
    """Plain values only (None, bool, numbers, strings, lists, tuples, dicts with string
    or integer keys; ``tensors``: tensors too), nested at most :data:`MAX_DEPTH` deep."""
    if depth > MAX_DEPTH:
        return f"{where}: nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            return f"{where}: a key of type {type(bad[0]).__name__}"
        items = ((f"{where}.{_name(str(k))}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, _SCALARS) or tensors and isinstance(value, torch.Tensor):
        return None
    else:
        return f"{where}: expected plain values, found {type(value).__name__}"
    return next((p for at, v in items if (p := _plain_problem(v, at, depth + 1, tensors))), None)


def _shown(value: Any) -> str:
    """A value in a message: a scalar's repr (at most 40 characters), else its type."""
    if isinstance(value, _SCALARS):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return type(value).__name__


def _name(name: str) -> str:
    """A tensor or key name as a message shows it: one line, at most 60 characters."""
    name = name.encode("unicode_escape").decode("ascii")
    return name if len(name) <= 60 else name[:57] + "..."


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict:
    """The last checkpoint's dict with its ``model`` the mean of all (integer buffers:
    the last one's), without the optimizer's state (for translating, not resuming). Every
    checkpoint must be of the same model and tokenizer (:func:`_differs`): else one line
    naming the file and what differs."""
    if not paths:
        raise TinyMTError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]  # each model a dict of tensors
    for p, s in zip(paths[:-1], states):
        why = _differs(s, states[-1])
        if why:
            raise TinyMTError(f"{p} is from a different model or tokenizer than {paths[-1]}: "
                              f"{why}; cannot average (only checkpoints of one run)")
    out = {k: v for k, v in states[-1].items() if k not in TRAINING_STATE[1:]}  # trainer_state kept
    out["model"] = {k: sum(s["model"][k].double() for s in states).div(len(states)).to(w.dtype)
                    if w.is_floating_point() else w for k, w in states[-1]["model"].items()}
    out["averaged_from"] = [str(p) for p in paths]
    return out


def _differs(state: dict, ref: dict) -> str | None:
    """What makes ``state`` another model or tokenizer than ``ref`` (None: nothing)."""
    a, b = state.get("tokenizer_sha256"), ref.get("tokenizer_sha256")
    if a != b:
        return f"its tokenizer differs (tokenizer_sha256 {_shown(a)[:14]} vs {_shown(b)[:14]})"
    if state["vocab"] != ref["vocab"]:
        return f"its vocab differs ({state['vocab']} vs {ref['vocab']})"
    a, b = state["model_config"], ref["model_config"]
    keys = sorted((k for k in {*a, *b} if a.get(k, "<unset>") != b.get(k, "<unset>")), key=str)
    if keys:
        return "its model_config differs (" + ", ".join(
            f"{k}={_shown(a.get(k, '<unset>'))} vs {_shown(b.get(k, '<unset>'))}"
            for k in keys[:3]) + (", ..." if len(keys) > 3 else "") + ")"
    mine, theirs = state["model"], ref["model"]
    if mine.keys() != theirs.keys():
        changes = [*(f"+{_name(k)}" for k in sorted(mine.keys() - theirs.keys())[:2]),
                   *(f"-{_name(k)}" for k in sorted(theirs.keys() - mine.keys())[:2])]
        return f"its model has other tensors ({', '.join(changes)})"
    for k, v in theirs.items():
        if mine[k].shape != v.shape or mine[k].dtype != v.dtype:
            return (f"its tensor {_name(k)} is {tuple(mine[k].shape)} {mine[k].dtype} vs "
                    f"{tuple(v.shape)} {v.dtype}")
    return None
