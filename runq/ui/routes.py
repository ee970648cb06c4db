"""The console's routes put together: ``/ui`` for every signed-in user, ``/ui/queue`` for
admins (the worker, session and admin guards), ``/ui/queue/schedules`` also without a
worker."""

from __future__ import annotations

from litestar import Router

from runq.api.guards import require_worker
from runq.ui.errors import handle_ui_exception
from runq.ui.limits_pages import (
    limits_page,
    pause_schedule_action,
    remove_pause_action,
    resume_schedule_action,
    schedules_page,
)
from runq.ui.pages import (
    bulk_action,
    cancel_action,
    continue_action,
    home,
    overview_live,
    overview_page,
    requeue_action,
    run_events_live,
    run_page,
    signin,
    signin_form,
    signout,
    workers_page,
)
from runq.ui.runs_pages import all_runs, all_runs_live, my_runs, my_runs_live
from runq.ui.session import ui_authenticate, ui_require_admin


def ui_router() -> Router:
    """``/ui``: the pages above; ``/ui/queue`` behind the worker, session and admin guards."""
    queue_pages = Router(
        path="/queue",
        route_handlers=[
            overview_page,
            overview_live,
            all_runs,
            all_runs_live,
            requeue_action,
            bulk_action,
            workers_page,
            limits_page,
            remove_pause_action,
        ],
        guards=[ui_authenticate, ui_require_admin, require_worker],
    )
    # As ``/queue/schedules``: schedules live in the database, so a replica without a
    # worker shows and changes them too.
    schedule_pages = Router(
        path="/queue/schedules",
        route_handlers=[schedules_page, pause_schedule_action, resume_schedule_action],
        guards=[ui_authenticate, ui_require_admin],
    )
    return Router(
        path="/ui",
        route_handlers=[
            signin_form,
            signin,
            signout,
            home,
            my_runs,
            my_runs_live,
            run_page,
            run_events_live,
            cancel_action,
            continue_action,
            queue_pages,
            schedule_pages,
        ],
        include_in_schema=False,
        exception_handlers={Exception: handle_ui_exception},
    )
