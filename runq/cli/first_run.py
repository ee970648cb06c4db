"""The guided first run: what ``runq serve`` on a terminal prints once it is ready.

Where the data and the key live, where the API and the console answer, and the command
that submits a first run, so a newcomer does not have to assemble them from the docs.
Only on a terminal: under systemd or in a container the log lines say it all.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from runq.config import Config, redact_url, store_engine
from runq.seal import key_file_for

#: A payload for the first run of the built-in ``task/echo``, which answers its payload.
FIRST_PAYLOAD = '{"hello": "world"}'


def program_name() -> str:
    """How the user started runq, as something they can type again."""
    argv0 = sys.argv[0] if sys.argv else "runq"
    if Path(argv0).name == "__main__.py":
        return "python -m runq"
    found = shutil.which("runq")
    if found is not None and Path(found).resolve() == Path(argv0).resolve():
        return "runq"
    return argv0


def _where_data_is(config: Config) -> tuple[str, str]:
    url = config.store.url
    if store_engine(url) == "sqlite":
        path = Path(url.removeprefix("sqlite:///")).absolute()
        database = str(path)
        default_key = f"{key_file_for(path)} (made on first start; back it up with the database)"
    else:
        database = f"{redact_url(url)} (schema {config.store.schema})"
        default_key = "none configured"
    keys = ", ".join(config.seal.keys) if config.seal.keys else default_key
    return database, keys


def welcome_text(config: Config, config_path: str | None) -> str:
    """The lines printed once, when the daemon is ready."""
    database, keys = _where_data_is(config)
    runq = program_name()
    if config_path:
        runq += f" --config {shlex.quote(config_path)}"
    lines = ["runq is ready.", f"  database:   {database}", f"  seal key:   {keys}"]
    listen = config.http.host_port
    if listen is None:
        lines.append("  HTTP API:   off ([http] listen is empty)")
    else:
        host, port = listen
        # A wildcard address is reachable on loopback; show one a browser can open.
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "", "*") else host
        base = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"
        lines.append(f"  HTTP API:   {base}  (auth: {config.http.auth})")
        lines.append(f"  console:    {base}/ui")
    if not config.queue.worker:
        lines.append("  worker:     off ([queue] worker = false): runs wait for another worker")
    lines += [
        "Submit a first run from another terminal (the daemon runs it within a second):",
        f"  {runq} defer task/echo --payload {shlex.quote(FIRST_PAYLOAD)}",
        f"  {runq} jobs list",
        "Stop with Ctrl+C (a second Ctrl+C stops at once).",
    ]
    return os.linesep.join(lines)
