"""The **Attention** tab of TensorBoard: a dynamic plugin (``tensorboard --logdir outputs``).

Registered through the ``tensorboard_plugins`` entry point in ``pyproject.toml``
(:class:`AttentionLoader`; TensorBoard >= 2.21 finds it with ``importlib.metadata``). It
reads the probes' view documents that the trainer logs (:mod:`tinymt.viewer.summary`)
through TensorBoard's data provider and serves them to the static ES module
``static/index.js``, which draws them with ``static/view.js`` -- the same script the
self-contained HTML file (:mod:`tinymt.viewer.html`) inlines.

Routes (under ``/data/plugin/tinymt_attention/``, answers in docs/viewer.md): the two
scripts, ``font.otf?text=`` (at most 4,096 characters), ``runs``, ``steps``, ``step``,
``trend``. A bad request is an HTTP 400 or 404, an unreadable record a 422 (``/step``), with
a one-line text; one run's data never breaks another's, and nothing crashes the server.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tinymt import KINDS
from tinymt.errors import first_line
from tinymt.fonts import FontBusy, font_for_query, refuse_when_busy
from tinymt.viewer import STATIC
from tinymt.viewer.document import document_json
from tinymt.viewer.summary import PLUGIN_NAME, decode, parse_meta

logger = logging.getLogger(__name__)
_ALL = 1_000_000  # read every logged step (the loader keeps them all: samples_per_plugin)
TREND_STEPS = 512  # one /trend answer: at most this many steps (more are thinned evenly) ...
TREND_NUMBERS = 1 << 20  # ... and this many numbers (~8 MB of JSON): the later steps left out


class _Refused(Exception):
    """A request answered with HTTP status ``args[0]`` and the one-line text ``args[1]``."""


def _route(method):
    """A data route: whatever goes wrong in it answers this request with one line (a 500
    for a fault of ours), never the server or another run."""
    @functools.wraps(method)
    def route(self, request):
        try:
            return method(self, request)
        except _Refused as e:
            return _error(request, *e.args)
        except Exception as e:  # noqa: BLE001  (the request's answer says what it was)
            logger.exception("tinymt_attention %s", request.path)
            return _error(request, 500, f"{request.path}: {type(e).__name__}: {first_line(e)}")
    return wrappers.Request.application(route)


class AttentionPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        self._provider = context.data_provider
        self._downsample = (context.sampling_hints or {}).get(PLUGIN_NAME) or _ALL

    def get_plugin_apps(self):
        return {"/index.js": self._static("index.js"), "/view.js": self._static("view.js"),
                "/font.otf": self._font, "/runs": self._runs, "/steps": self._steps,
                "/step": self._step, "/trend": self._trend}

    def is_active(self):
        return False  # TensorBoard's own listing of our plugin's data decides

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Attention",
                                            disable_reload=False)

    # ------------------------------------------------------------------ static files
    def _static(self, name: str):
        body = (STATIC / name).read_bytes()  # read once, not per request
        return wrappers.Request.application(
            lambda request: http_util.Respond(request, body, "text/javascript"))

    @_route
    def _font(self, request):
        """``font.otf?text=<characters>``: Noto Sans CJK SC cut to them (and ASCII; no
        ``text``: ASCII only), cut one at a time (:func:`tinymt.fonts.font_for_query`)."""
        try:
            refuse_when_busy(request.query_string)  # before the query is parsed
            font = font_for_query(request.args.get("text"))
        except ValueError as e:
            raise _Refused(400, str(e)) from None
        except FontBusy as e:
            raise _Refused(503, str(e)) from None
        return http_util.Respond(request, font, "font/otf", expires=24 * 3600)

    # ------------------------------------------------------------------ data
    @_route
    def _runs(self, request):
        ctx, eid = _context(request)
        listing = self._provider.list_tensors(ctx, experiment_id=eid, plugin_name=PLUGIN_NAME)
        runs = []
        for run in sorted(listing):
            probes = []
            for tag, series in sorted(listing[run].items(), key=_tag_order):
                try:
                    probes.append({"tag": tag, **parse_meta(series.plugin_content)})
                except ValueError as e:
                    probes.append({"tag": tag, "sentence": "", "reference": None, "error": str(e)})
            runs.append({"run": run, "probes": probes})
        return http_util.Respond(request, {"runs": runs}, "application/json")

    @_route
    def _steps(self, request):
        steps = sorted(self._series(request))  # nothing decoded
        return http_util.Respond(request, {"steps": steps}, "application/json")

    @_route
    def _step(self, request):
        series = self._series(request)
        raw = request.args.get("step", "")
        try:
            step = int(raw)
        except ValueError:
            raise _Refused(400, f"step={raw[:40]!r} is not an integer") from None
        if step not in series:
            raise _Refused(404, f"no step {step} in this run and tag")
        where = f"run {request.args['run'][:80]!r}, tag {request.args['tag'][:80]!r}, step {step}"
        try:  # what the reader refuses, or a value JSON cannot hold (1e999 read as inf)
            body = document_json(decode(_record(series[step].numpy)))
        except ValueError as e:
            raise _Refused(422, f"{where}: unreadable record: {e}") from None
        return http_util.Respond(request, body, "application/json")

    @_route
    def _trend(self, request):
        """Every head's entropy and gold share (:func:`_trend_of`) at the steps of ``run=`` /
        ``tag=``, at most :data:`TREND_STEPS` evenly spread (the first and the last kept) and
        :data:`TREND_NUMBERS` numbers (the later steps left out); ``null`` where a record is
        unreadable (its reason in ``errors``), lacks the kind, or a number is not finite.
        The answer's shape: docs/viewer.md."""
        series = self._series(request)
        logged = sorted(series)
        picked = np.unique(np.linspace(0, len(logged) - 1, TREND_STEPS).round().astype(int))
        steps, trends, numbers = [], [], 0
        for step in (logged[i] for i in picked):
            trend = _trend_of(series[step])  # its numbers (an unreadable record's reason: 1)
            numbers += 1 if isinstance(trend, str) else sum(
                e.size + (0 if g is None else g.size) for e, g in trend.values())
            if numbers > TREND_NUMBERS and steps:
                break
            steps.append(step)
            trends.append(trend)
        errors = [{"step": s, "error": t} for s, t in zip(steps, trends) if isinstance(t, str)]
        found = [{} if isinstance(t, str) else t for t in trends]
        kinds = {kind: {name: [_heads_json(t[kind][i]) if kind in t else None for t in found]
                        for i, name in enumerate(("entropy", "gold"))}
                 for kind in KINDS if any(kind in t for t in found)}
        return http_util.Respond(request, {"steps": steps, "logged": len(logged),
                                           "kinds": kinds, "errors": errors},
                                 "application/json")

    def _series(self, request) -> dict:
        """``{step: datum}`` of ``run=`` / ``tag=``, the last one logged at a step (records
        not decoded). TensorBoard's data provider has no way to read one step: it hands
        over every record of the tag."""
        run, tag = request.args.get("run"), request.args.get("tag")
        if not run or not tag:
            raise _Refused(400, "run= and tag= are required")
        ctx, eid = _context(request)
        data = self._provider.read_tensors(
            ctx, experiment_id=eid, plugin_name=PLUGIN_NAME, downsample=self._downsample,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]))
        series = data.get(run, {}).get(tag)
        if not series:
            raise _Refused(404, f"no attention data for run {run[:80]!r}, tag {tag[:80]!r}")
        return {d.step: d for d in series}


def _trend_of(datum) -> dict | str:
    """``{kind: (entropy, gold)}`` of a logged record, each a float64 (layers, heads) array
    rounded to 4 decimals: the header's entropy, and :func:`_gold_share` (``None`` for a
    kind without gold cells); or why the record could not be read (one line)."""
    try:
        doc = decode(_record(datum.numpy))
        with np.errstate(over="ignore"):  # an entropy near the float range: inf (null in JSON)
            return {kind: (np.asarray(view["entropy"], np.float64).round(4),
                           _gold_share(view["weights"], view["gold"]))
                    for kind, view in doc["kinds"].items()}
    except ValueError as e:
        return f"unreadable record: {first_line(e)}"


def _gold_share(w: np.ndarray, gold: list):
    """Each head's share of attention on the gold cells: over the rows with a gold cell,
    the row's weight on them over the row's sum of weights, averaged; a gold cell listed
    twice counts once. A row whose weights are all 0 (a spread row quantized to nothing)
    has no share and is left out of its head's average; a head left without rows is NaN.
    ``None`` without gold cells. ``w``: uint8 (layers, heads, T_q, T_k)."""
    if not gold:
        return None
    t_k = w.shape[3]
    cells = np.unique(np.array([c[0] * t_k + c[1] for c in gold], np.int64))  # row-major
    r, c = np.divmod(cells, t_k)
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])  # each row's first cell
    on_gold = np.add.reduceat(w[:, :, r, c].astype(np.int64), starts, axis=-1)
    total = w.sum(-1, dtype=np.int64)[:, :, r[starts]]  # (layers, heads, gold rows)
    counted = total > 0
    share = np.where(counted, on_gold, 0) / np.where(counted, total, 1)
    n = counted.sum(-1)
    with np.errstate(invalid="ignore"):
        return np.where(n > 0, share.sum(-1) / n, np.nan).round(4)


def _heads_json(a: np.ndarray | None) -> list | None:
    """A (layers, heads) array as nested lists, a number that is not finite (NaN, and an
    entropy near the float range rounded to infinity) as ``None``; no array: ``None``."""
    return None if a is None else [[x if math.isfinite(x) else None for x in row]
                                   for row in a.tolist()]


class AttentionLoader(base_plugin.TBLoader):
    """Loads :class:`AttentionPlugin` and keeps every logged step of it (TensorBoard
    otherwise keeps a random 10 per tag), unless ``--samples_per_plugin`` says otherwise."""

    def fix_flags(self, flags):
        flags.samples_per_plugin.setdefault(PLUGIN_NAME, 0)  # 0: all

    def load(self, context):
        return AttentionPlugin(context)


def _context(request):
    return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)


def _tag_order(item):
    """``probe_<k>`` by ``k``, then other tags by name (any name: a tag is data too)."""
    tag = item[0]
    k = tag.rsplit("_", 1)[-1]
    return (int(k) if k.isascii() and k.isdigit() and len(k) < 19 else 1 << 63, tag)


def _record(array: np.ndarray) -> bytes:
    """The bytes of a record: a string tensor holding one value."""
    value = array.item() if array.size == 1 else None
    if not isinstance(value, bytes):
        raise ValueError(f"not a string tensor of one value (dtype {array.dtype}, shape "
                         f"{array.shape})")
    return value


def _error(request, code: int, message: str):
    return http_util.Respond(request, " ".join(message.split())[:500], "text/plain", code=code)
