"""Serving a trained model over HTTP (``scripts/serve.py``, docs/serve.md): ``app`` (the
routes; ``serve(cfg)``), ``api`` (LibreTranslate's fields, limits and answers), ``service``
(the model behind ``batcher``: micro-batching on one worker thread).
"""

from tinymt.serve.app import create_app, serve
from tinymt.serve.service import Service

__all__ = ["Service", "create_app", "serve"]
