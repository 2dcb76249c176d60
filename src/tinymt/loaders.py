"""The one loader of config files (a run's ``config.yaml``): read through
:func:`tinymt.files.read_bytes`, checked before anything uses it.

:func:`load_config_file` answers a plain ``dict`` or one :class:`TinyMTError` line naming
the file: a regular file (a pipe or device is never opened) of at most
:data:`MAX_CONFIG_BYTES` (a larger one is refused by its size, not read whole), UTF-8,
YAML whose events are counted before anything is built from them (nesting at most
:data:`MAX_CONFIG_DEPTH` deep, no aliases: ``&a [*a, *a]`` repeated would expand to more
than memory holds), parsed by OmegaConf's loader (no Python tags, no duplicate keys),
a mapping at the top, its interpolations resolved.

:func:`load_json_file` is its counterpart for the JSON files tinymt writes (a run's
``metrics.json``, a data cache's ``COMPLETE`` marker and ``stats.json``, an export's
``tinymt_export.json``): the same read, nesting bounded, finite numbers only, and the kind
of value at the top checked. (Checkpoints have their loader in :mod:`tinymt.checkpoint`.)
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from tinymt.errors import TinyMTError, first_line
from tinymt.files import parse_json, read_bytes

MAX_CONFIG_BYTES = 1 << 20  # a run's config.yaml is about 1.5 kB
MAX_CONFIG_DEPTH = 32  # a run's config nests 3 deep
_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the events only: no objects


def load_config_file(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (``what``: how messages name it, e.g. "the
    run's config"), checked as the module says; one line naming the file otherwise."""
    data = read_bytes(path, what, MAX_CONFIG_BYTES)
    name = f"{what} {path}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TinyMTError(f"{name} is not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise TinyMTError(f"{name} is empty")
    check_yaml_shape(text, name)
    try:
        cfg = OmegaConf.create(text)
    except Exception as e:  # noqa: BLE001  (yaml's errors, omegaconf's key/type errors)
        raise TinyMTError(f"{name} is not valid YAML ({yaml_why(e)})") from None
    if not isinstance(cfg, DictConfig):  # pragma: no cover - refused on its events
        raise TinyMTError(f"{name} does not hold a mapping of settings")
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # noqa: BLE001  (an interpolation that does not resolve)
        raise TinyMTError(f"{name}: a value does not resolve ({first_line(e)})") from None


def load_json_file(path: str | os.PathLike, what: str, max_bytes: int = MAX_CONFIG_BYTES,
                   top: type = dict) -> Any:
    """The JSON value in ``path``, a ``top`` (dict: an object); one line naming the file
    (as ``what``) when it is not a regular file of at most ``max_bytes``, not UTF-8, not
    JSON, nested too deep or of another kind."""
    name = f"{what} {path}"
    value = parse_json(read_bytes(path, what, max_bytes), name)
    if not isinstance(value, top):
        kind = {dict: "an object", list: "a list"}.get(top, top.__name__)
        raise TinyMTError(f"{name} does not hold {kind} (found {type(value).__name__})")
    return value


def check_yaml_shape(text: str, name: str, max_depth: int = MAX_CONFIG_DEPTH) -> None:
    """YAML ``text`` that parses, holds a mapping, is nested at most ``max_depth`` deep and
    has no aliases: checked on the parser's events (nothing is built), so a deep or
    self-repeating document is refused before it costs stack or memory."""
    depth, top = 0, None
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if top is None and isinstance(event, yaml.NodeEvent):
                top = event
                if not isinstance(event, yaml.MappingStartEvent):
                    found = "a list" if isinstance(event, yaml.SequenceStartEvent) else "one value"
                    raise TinyMTError(f"{name} does not hold a mapping of settings (found "
                                      f"{found})")
            if isinstance(event, _OPEN):
                depth += 1
                if depth > max_depth:
                    raise TinyMTError(f"{name} is nested deeper than {max_depth} levels")
            elif isinstance(event, _CLOSE):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                raise TinyMTError(f"{name} uses a YAML alias (*{event.anchor}): not a file "
                                  "tinymt wrote")
    except yaml.YAMLError as e:
        raise TinyMTError(f"{name} is not valid YAML ({yaml_why(e)})") from None


def yaml_why(e: Exception) -> str:
    """A YAML error in one line: its problem and where (the first line of others)."""
    problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
    if problem and mark is not None:
        return f"{first_line(problem)} at line {mark.line + 1}, column {mark.column + 1}"
    return first_line(e)
