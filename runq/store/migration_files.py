"""The migration scripts shipped as package data, ``migrations/<engine>/NNNN_name.sql``."""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str  # with {schema} still in place


_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@functools.cache
def load_migrations(engine: str) -> tuple[Migration, ...]:
    """``runq/store/migrations/<engine>/NNNN_name.sql`` in version order."""
    folder = resources.files("runq.store").joinpath("migrations", engine)
    found: list[Migration] = []
    for entry in folder.iterdir():
        m = _MIGRATION_RE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    return tuple(found)


def split_sql(script: str) -> list[str]:
    """Split a migration script into statements, dropping ``--`` comment lines.

    A statement ends at a ``;`` where ``sqlite3.complete_statement`` says the text so far
    is complete, so a trigger's ``BEGIN ...; ...; END;`` body stays one statement; each
    statement can then run inside the migrating transaction.
    """
    lines = [ln for ln in script.splitlines() if not ln.lstrip().startswith("--")]
    statements: list[str] = []
    pending = ""
    for piece in "\n".join(lines).split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip().removesuffix(";").strip())
            pending = ""
    statements.append(pending.strip().removesuffix(";").strip())
    return [s for s in statements if s]
