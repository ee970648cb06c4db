"""The console's limits pages (admin): schedules, and limits with the active pauses.

Each action is what the CLI and the API already do (``set_schedule_paused``,
``Store.remove_pause``), behind the console's CSRF check, answered with a redirect.
"""

from __future__ import annotations

from urllib.parse import urlencode

from litestar import Response, get, post
from litestar.response import Redirect

from runq.api.guards import services_of
from runq.errors import NotFound
from runq.ui.render import render
from runq.ui.session import AnyRequest, check_csrf, identity_of

HTML = Response[str]

#: What a redirect after an action here may say; the URL carries the key, never free text.
FLASH_MESSAGES: dict[str, str] = {
    "schedule_paused": "The schedule is paused on every replica.",
    "schedule_resumed": "The schedule is resumed; it fires again from its next slot.",
    "pause_removed": "The pause is removed; its runs may be claimed again.",
}
#: Longest schedule name or pause id a console URL may carry (never sent to the database).
MAX_NAME_CHARS = 200


def _flash(request: AnyRequest) -> str | None:
    return FLASH_MESSAGES.get(request.query_params.get("done") or "")


async def _csrf_checked(request: AnyRequest) -> None:
    check_csrf(request, (await request.form()).get("csrf"))


@get("/")
async def schedules_page(request: AnyRequest) -> HTML:
    services = services_of(request)
    return render(
        request,
        "schedules.html",
        identity=identity_of(request),
        title="Schedules",
        schedules=await services.ops.schedules(),
        flash=_flash(request),
    )


async def _set_schedule(request: AnyRequest, name: str, *, paused: bool) -> Redirect:
    await _csrf_checked(request)
    if len(name) > MAX_NAME_CHARS:
        raise NotFound("no such schedule")
    services = services_of(request)
    await services.ops.set_schedule_paused(name, paused=paused)
    done = "schedule_paused" if paused else "schedule_resumed"
    return Redirect(f"/ui/queue/schedules?{urlencode({'done': done})}", status_code=303)


@post("/{name:str}/pause", status_code=303)
async def pause_schedule_action(request: AnyRequest, name: str) -> Redirect:
    return await _set_schedule(request, name, paused=True)


@post("/{name:str}/resume", status_code=303)
async def resume_schedule_action(request: AnyRequest, name: str) -> Redirect:
    return await _set_schedule(request, name, paused=False)


@get("/limits")
async def limits_page(request: AnyRequest) -> HTML:
    groups, pause_uses = await services_of(request).ops.limits_use()
    return render(
        request,
        "limits.html",
        identity=identity_of(request),
        title="Limits and pauses",
        groups=groups,
        pauses=pause_uses,
        flash=_flash(request),
    )


@post("/pauses/{pause_id:str}/remove", status_code=303)
async def remove_pause_action(request: AnyRequest, pause_id: str) -> Redirect:
    """As ``DELETE /queue/pauses/{id}``: the paused runs may be claimed at once."""
    await _csrf_checked(request)
    services = services_of(request)
    removed = None if len(pause_id) > MAX_NAME_CHARS else await services.ops.remove_pause(pause_id)
    if removed is None:
        raise NotFound("no such pause (already removed?)")
    services.wake()
    return Redirect("/ui/queue/limits?done=pause_removed", status_code=303)
