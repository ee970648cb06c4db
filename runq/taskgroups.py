"""Unwrapping the exception groups that anyio task groups raise."""

from __future__ import annotations


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside ``group`` (nested groups flattened), or None when several.

    A task group that hosts a background task wraps the exception of its own body in a
    group; context managers built on one re-raise that exception alone (outside the
    ``except`` block, so its ``__context__`` stays its own) and callers see ``NotFound``,
    not ``ExceptionGroup``.
    """
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner
