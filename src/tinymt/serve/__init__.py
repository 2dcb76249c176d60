"""Serving a trained model over HTTP (``scripts/serve.py``, docs/serve.md).

``server`` (``serve(cfg)``: load, warm up, listen, stop cleanly) runs ``app`` (the routes),
which reads requests with ``api`` (LibreTranslate's fields, limits and answers) and asks
``service`` (the model behind ``batcher``: micro-batching on one worker thread).
"""

from tinymt.serve.app import create_app
from tinymt.serve.server import serve
from tinymt.serve.service import Service

__all__ = ["Service", "create_app", "serve"]
