"""The **Attention** tab of TensorBoard: a dynamic plugin (``tensorboard --logdir outputs``).

Registered through the ``tensorboard_plugins`` entry point in ``pyproject.toml``
(:class:`AttentionLoader`; TensorBoard >= 2.21 finds it with ``importlib.metadata``). It
reads the probes' view documents that the trainer logs (:mod:`tinymt.viewer.summary`)
through TensorBoard's data provider and serves them to the static ES module
``static/index.js``, which draws them with ``static/view.js`` -- the same script the
self-contained HTML file (:mod:`tinymt.viewer.html`) inlines.

Routes (under ``/data/plugin/tinymt_attention/``): ``index.js``, ``view.js``,
``font.otf`` (Noto Sans CJK, so Chinese renders without system fonts); ``runs`` (every run
and its probes), ``steps?run=&tag=`` (the steps logged), ``step?run=&tag=&step=`` (one
view document, weights as integers 0..255). A bad request is an HTTP 400 or 404 with a
one-line text, never a crash.
"""

from __future__ import annotations

import json

from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tinymt.viewer.assets import STATIC, font_path
from tinymt.viewer.summary import PLUGIN_NAME, decode, probe_meta

_ALL = 1_000_000  # read every logged step (the loader keeps them all: samples_per_plugin)


class AttentionPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        self._provider = context.data_provider
        self._downsample = (context.sampling_hints or {}).get(PLUGIN_NAME) or _ALL

    def get_plugin_apps(self):
        return {"/index.js": self._static("index.js"), "/view.js": self._static("view.js"),
                "/font.otf": self._font, "/runs": self._runs, "/steps": self._steps,
                "/step": self._step}

    def is_active(self):
        return False  # TensorBoard's own listing of our plugin's data decides

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Attention",
                                            disable_reload=True)

    # ------------------------------------------------------------------ static files
    def _static(self, name: str):
        @wrappers.Request.application
        def serve(request):
            return http_util.Respond(request, (STATIC / name).read_bytes(), "text/javascript")
        return serve

    @wrappers.Request.application
    def _font(self, request):
        return http_util.Respond(request, font_path().read_bytes(), "font/otf",
                                 expires=24 * 3600)

    # ------------------------------------------------------------------ data
    @wrappers.Request.application
    def _runs(self, request):
        ctx, eid = _context(request)
        listing = self._provider.list_tensors(ctx, experiment_id=eid, plugin_name=PLUGIN_NAME)
        runs = []
        for run in sorted(listing):
            probes = [{"tag": tag, **probe_meta(series.plugin_content)}
                      for tag, series in sorted(listing[run].items(), key=_tag_order)]
            runs.append({"run": run, "probes": probes})
        return _json(request, {"runs": runs})

    @wrappers.Request.application
    def _steps(self, request):
        data = self._series(request)
        if not isinstance(data, list):
            return data
        return _json(request, {"steps": sorted(d.step for d in data)})

    @wrappers.Request.application
    def _step(self, request):
        data = self._series(request)
        if not isinstance(data, list):
            return data
        raw = request.args.get("step", "")
        try:
            step = int(raw)
        except ValueError:
            return _error(request, 400, f"step={raw!r} is not an integer")
        found = [d for d in data if d.step == step]
        if not found:
            return _error(request, 404, f"no step {step} in this run and tag")
        try:
            doc = decode(found[-1].numpy.item())
        except (ValueError, AttributeError, KeyError, TypeError) as e:
            return _error(request, 500, f"unreadable record at step {step}: {e}")
        for view in doc["kinds"].values():
            view["weights"] = view["weights"].tolist()
        return _json(request, doc)

    def _series(self, request):
        """The logged data of ``run=`` / ``tag=``, or an error response."""
        run, tag = request.args.get("run"), request.args.get("tag")
        if not run or not tag:
            return _error(request, 400, "run= and tag= are required")
        ctx, eid = _context(request)
        data = self._provider.read_tensors(
            ctx, experiment_id=eid, plugin_name=PLUGIN_NAME, downsample=self._downsample,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]))
        series = data.get(run, {}).get(tag)
        if not series:
            return _error(request, 404, f"no attention data for run {run!r}, tag {tag!r}")
        return list(series)


class AttentionLoader(base_plugin.TBLoader):
    """Loads :class:`AttentionPlugin` and keeps every logged step of it (TensorBoard
    otherwise keeps a random 10 per tag), unless ``--samples_per_plugin`` says otherwise."""

    def fix_flags(self, flags):
        hints = getattr(flags, "samples_per_plugin", None)
        if isinstance(hints, dict):
            hints.setdefault(PLUGIN_NAME, 0)  # 0: all

    def load(self, context):
        return AttentionPlugin(context)


def _context(request):
    return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)


def _tag_order(item):
    tag = item[0]
    return (int(tag.rsplit("_", 1)[-1]) if tag.rsplit("_", 1)[-1].isdigit() else 1 << 30, tag)


def _json(request, obj):
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return http_util.Respond(request, body, "application/json")


def _error(request, code: int, message: str):
    return http_util.Respond(request, message, "text/plain", code=code)
