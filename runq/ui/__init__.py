"""The operator console: ``/ui``, server-rendered pages served by ``runq serve`` itself.

Everything the browser loads comes from this package (templates, one stylesheet, one
small script, a vendored and pinned htmx): no CDN, no build step, no network needed.
``ui_routes()`` is what the API app mounts; nothing else of the app changes for it.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Router
from litestar.datastructures import CacheControlHeader
from litestar.static_files import create_static_files_router

STATIC_DIR = Path(__file__).resolve().parent / "static"


def ui_routes() -> list[Router]:
    """The console's pages under ``/ui`` and its static files under ``/ui/static``."""
    from runq.ui.routes import ui_router

    pages = ui_router()
    static = create_static_files_router(
        path="/ui/static",
        directories=[STATIC_DIR],
        name="ui_static",
        # Asset URLs carry a version (render.ASSET_VERSION), so an hour of caching is safe.
        cache_control=CacheControlHeader(max_age=3600, private=True),
        include_in_schema=False,
    )
    return [pages, static]


__all__ = ["STATIC_DIR", "ui_routes"]
