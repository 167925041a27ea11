"""The dashboard at /ui: static ES modules (agent/surfaces/ui/static/) that call /tasks, /system and /ws
from the browser like any other client.

Why only static files: the dashboard holds no data of its own, so it needs no route that reads the
database and no authentication of its own. With JWT on, the page is public and every data call
carries the token the operator typed in (docs/dashboard.md). The files ship as package data, so an
installed wheel serves them without a network or a build step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"

# The page runs only its own scripts and talks only to its own origin (and its /ws): a task name
# that slipped past the escaping could still not load or run anything.
HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self' ws: wss:; object-src 'none'; base-uri 'none'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def _index(_request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


async def _slash(_request: Request) -> Response:
    return RedirectResponse("/ui", status_code=307)


class _Assets(StaticFiles):
    """StaticFiles with the page's headers, and JavaScript always served as JavaScript (browsers
    refuse an ES module with another type; the system's MIME table may not know `.js`)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        path = str(args[0]) if args else ""
        if path.endswith(".js"):
            response.headers["content-type"] = "text/javascript; charset=utf-8"
        response.headers.update(HEADERS)
        return response


def ui_routes() -> list[Route | Mount]:
    return [
        Route("/ui", _index, methods=["GET", "HEAD"]),
        Route("/ui/", _slash, methods=["GET", "HEAD"]),
        Mount("/ui/static", app=_Assets(directory=STATIC), name="ui-static"),
    ]
