"""The HTTP routes (Starlette): LibreTranslate's API, the page, its view data, health.

    POST /translate     LibreTranslate's (tinymt.serve.api)
    GET  /languages     the model's language pair
    POST /attention     q (a string or a list), api_key -> {"translatedText": [...],
                        "view": the view data of every sentence (tinymt.viewer.html.inline_data)}
    GET  /health        {"status": "ok", the model, its limits, the queue, batch counts}
    GET  /              the page: type sentences, read the translations, see every head
    GET  /view.js, /page.js, /font.otf   what the page is made of (nothing from elsewhere);
                        font.otf is Noto Sans CJK SC (Simplified Chinese glyph forms,
                        tinymt.fonts): ?text=<characters> cut to those (at most
                        4,096), without text= the whole font

Every error is ``{"error": "<one line>"}`` with its status; no route takes a file path.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from tinymt.fonts import font_for_query, font_path, sc_font_file
from tinymt.serve.api import (
    ApiError,
    check_key,
    read_fields,
    text_items,
    translate_answer,
    translate_request,
)
from tinymt.serve.service import Service
from tinymt.viewer.assets import STATIC as VIEW_STATIC

STATIC = Path(__file__).resolve().parent / "static"
# the page loads only its own files; view.js draws with inline styles
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
                               "style-src 'self' 'unsafe-inline'; font-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FONT_HEADERS = {"Cache-Control": "public, max-age=86400"}
Handler = Callable[[Request], Awaitable[Response]]


def _json_errors(handler: Handler) -> Handler:
    """A route whose every failure is ``{"error": ...}``: ours with their status, anything
    else a 500 (one line on stderr, no traceback)."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        except Exception as e:  # noqa: BLE001  (the server stays up)
            print(f"error: {request.url.path}: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
            return JSONResponse({"error": f"internal error ({type(e).__name__})"},
                                status_code=500)

    return route


def create_app(service: Service) -> Starlette:
    """The routes of the module docstring over ``service``; ``service.close()`` when the
    server stops (after the requests it accepted have their answers)."""

    @_json_errors
    async def translate(request: Request) -> Response:
        with service.batcher.arrival() as arrival:  # a batch being gathered waits for it
            fields = await read_fields(request, service.limits)
            check_key(fields, service.keys)
            req = translate_request(fields, service.limits, service.pair, service.decode.beam)
            nbests = await service.translate(req.items, req.alternatives + 1, arrival)
        return JSONResponse(translate_answer(req, nbests, service.pair))

    @_json_errors
    async def languages(request: Request) -> Response:
        return JSONResponse(service.pair.languages())

    @_json_errors
    async def attention(request: Request) -> Response:
        if not service.attention_items:
            raise ApiError(400, "attention maps are off on this server (they need "
                                "engine=torch and attention_items > 0)")
        fields = await read_fields(request, service.limits)
        check_key(fields, service.keys)
        items, _ = text_items(fields, service.limits, service.attention_items)
        return JSONResponse(await service.attention(items))

    @_json_errors
    async def health(request: Request) -> Response:
        return JSONResponse(service.health())

    @_json_errors
    async def font(request: Request) -> Response:
        text = request.query_params.get("text")
        if text is None:  # the whole font (built once, 2 s; the source's if it cannot be)
            path = await run_in_threadpool(sc_font_file)
            return FileResponse(path or font_path(), media_type="font/otf",
                                headers=FONT_HEADERS)
        try:
            data = await run_in_threadpool(font_for_query, text)  # 0.4 s a new text
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return Response(data, media_type="font/otf", headers=FONT_HEADERS)

    def static(path: Path, media_type: str, headers: dict | None = None) -> Handler:
        async def serve(request: Request) -> Response:
            return FileResponse(path, media_type=media_type, headers=headers)
        return serve

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    routes = [
        Route("/translate", translate, methods=["POST"]),
        Route("/languages", languages, methods=["GET"]),
        Route("/attention", attention, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/", static(STATIC / "page.html", "text/html; charset=utf-8", PAGE_HEADERS)),
        Route("/page.js", static(STATIC / "page.js", "text/javascript; charset=utf-8")),
        Route("/view.js", static(VIEW_STATIC / "view.js", "text/javascript; charset=utf-8")),
        Route("/font.otf", font),
    ]
    # LibreTranslate answers browsers of any origin (web apps, extensions): so do we
    middleware = [Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"],
                             allow_headers=["*"])]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        service.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers={HTTPException: not_found})
