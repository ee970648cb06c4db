"""Server-side HTML: one Jinja2 environment over the package's templates.

The environment belongs to the console rather than to the app (Litestar's template
config is app-wide), so mounting the console is one router and nothing else. Autoescape
is on for every template: run fields are user input and must never become markup.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from litestar import Response
from litestar.connection import ASGIConnection

from runq.ui import chart
from runq.ui.session import csrf_token

STATIC_PATH = "/ui/static"
#: Bumped with the stylesheet or script, so browsers never keep a stale copy.
ASSET_VERSION = "2"


def iso_time(value: float | None) -> str:
    if value is None:
        return ""
    return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="seconds")


def short_time(value: float | None) -> str:
    """``2026-11-30 16:04:05Z``: readable in a table cell, unambiguous (always UTC)."""
    if value is None:
        return "—"
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``: an age as an operator reads it."""
    if seconds is None:
        return "—"
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def compact_json(value: Any) -> str:
    """One line, spelled as the page script spells a live event's data (``JSON.stringify``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def clock(value: float) -> str:
    """``16:04``: a minute on a chart axis (always UTC)."""
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%H:%M")


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("runq.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        iso_time=iso_time,
        short_time=short_time,
        duration=duration,
        pretty_json=pretty_json,
        compact_json=compact_json,
        clock=clock,
    )
    env.globals.update(static=STATIC_PATH, asset_version=ASSET_VERSION, chart=chart)
    return env


def partial(template: str, **context: Any) -> str:
    """A partial template (no page around it), rendered alone for a live stream."""
    return environment().get_template(template).render(**context)


def fragment(template: str, macro: str, *args: Any) -> str:
    """One macro of a template, rendered alone (what a live stream sends)."""
    rendered: str = getattr(environment().get_template(template).module, macro)(*args)
    return str(rendered)


def render(
    connection: ASGIConnection[Any, Any, Any, Any],
    template: str,
    *,
    status_code: int = 200,
    **context: Any,
) -> Response[str]:
    """A whole page; ``context`` gets the CSRF token and the current path on top."""
    context.setdefault("identity", None)
    context.setdefault("live", None)
    context.setdefault("flash", None)
    html = (
        environment()
        .get_template(template)
        .render(csrf=csrf_token(connection), path=connection.url.path, **context)
    )
    return Response(
        html,
        status_code=status_code,
        media_type="text/html",
        headers=SECURITY_HEADERS,
    )


#: Pages are never framed (clickjacking), run only the console's own scripts and styles,
#: and are not cached: they show queue state and, for some runs, their content.
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
