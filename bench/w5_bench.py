"""W5, HTTP submission: wrk against ``runq serve`` or the floor app, one system per call.

    .venv/bin/python bench/w5_bench.py --system runq --engine postgres --dsn DSN \
        [--auth key] [--duration 10] [--warmup 2] [--connections 16,64] \
        [--scenarios post,batch,get] [--pyspy FILE --pyspy-scenario post_c16]

One server (``runq serve`` with the HTTP API on a free loopback port, or
``w5/floor_app.py``), then for each scenario and connection count a warm-up wrk run
(discarded) and a measured one: ``post`` (``POST /runs``, one background run), ``batch``
(``POST /runs/batch`` of 100 runs), ``get`` (``GET /runs/{id}`` over ids submitted
beforehand through ``POST /runs/batch``). wrk (Debian package ``wrk``) is the load
generator: a Lua script (``w5/wrk.lua``) sets the requests and prints wrk's latency
percentiles as JSON. Where two CPUs are allowed, the server is pinned to the first and
wrk to the second (``taskset``); PostgreSQL is not pinned (it is the machine's shared
server). The server's CPU per request comes from /proc across each measured run.

``runq serve`` runs API-only (``[queue] worker = false``: the runs stay queued, no claimer
competes for the CPU) with ``max_queue_depth = 0``, sealing on (PostgreSQL: an env key;
SQLite: the default key file), auth ``open`` on loopback or (``--auth key``)
``Authorization: Bearer``. The floor gets runq's schema from ``runq migrate`` and inserts
into the same table. Prints one ``RESULT {json}`` line with flat keys
``{scenario}_c{connections}_{metric}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ROOT = common.BENCH_DIR.parent
W5_DIR = common.BENCH_DIR / "w5"
RUNQ_BIN = str(Path(sys.executable).parent / "runq")
SCHEMA = "runq"
BATCH_SIZE = 100
SCENARIOS = ("post", "batch", "get")
#: Every run's payload: a small JSON object, as a typical submission carries.
PAYLOAD = {"task": "summarize", "document_id": "doc-000123", "options": {"lang": "en"}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_pins() -> tuple[str | None, str | None]:
    """(server CPU, wrk CPU): the first two CPUs this process may use, or no pinning."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    return str(allowed[0]), str(allowed[1])


def pinned(cmd: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *cmd] if cpu is not None else cmd


def runq_config(path: Path, *, url: str, port: int, auth: str) -> None:
    # API only: the runs stay queued and no claimer competes for the server's core.
    queue = {"worker": False, "max_queue_depth": 0, "max_delayed": 0}
    http = {"listen": f"127.0.0.1:{port}", "auth": auth}
    components = {"task/noop": "bench_components:noop"}
    path.write_text(common.runq_config_text(url, queue=queue, http=http, components=components))


def bodies(workdir: Path) -> tuple[Path, Path]:
    one = {"component_type": "task", "component_id": "noop", "payload": PAYLOAD}
    post = workdir / "post.json"
    post.write_text(json.dumps({**one, "background": True}))
    batch = workdir / "batch.json"
    batch.write_text(json.dumps({"items": [one] * BATCH_SIZE}))
    return post, batch


class Server:
    """The system under test as a pinned subprocess with its log."""

    def __init__(self, args: argparse.Namespace, workdir: Path, cpu: str | None) -> None:
        self.args = args
        self.workdir = workdir
        self.cpu = cpu
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = secrets.token_urlsafe(32)
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if args.auth == "key" else {}
        self.log_path = Path(args.logdir) / f"w5_{args.system}_{args.engine}_{args.auth}.log"
        self.env = {**common.runq_env(common.new_seal_key()), "RUNQ_API_KEY": self.api_key}
        self.proc: subprocess.Popen[Any] | None = None

    def url(self) -> str:
        if self.args.engine == "sqlite":
            return f"sqlite:///{self.workdir / 'w5.db'}"
        return str(self.args.dsn)

    def start(self) -> None:
        cfg = self.workdir / "runq.toml"
        runq_config(cfg, url=self.url(), port=self.port, auth=self.args.auth)
        if self.args.system == "runq":
            cmd = [RUNQ_BIN, "serve", "--config", str(cfg), "--log-format", "json"]
        else:
            # The floor needs runq's schema, made by runq's own command, then no runq code.
            subprocess.run(
                [RUNQ_BIN, "migrate", "--config", str(cfg)],
                env=self.env,
                check=True,
                capture_output=True,
            )
            cmd = [sys.executable, str(W5_DIR / "floor_app.py"), "--url", self.url()]
            cmd += ["--schema", SCHEMA, "--port", str(self.port)]
            cmd += ["--framework", "asgi" if self.args.system == "asgi" else "litestar"]
        self.proc = common.start_process(
            pinned(cmd, self.cpu), env=self.env, log_path=self.log_path
        )

    async def wait_ready(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=self.base, timeout=2) as client:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited: {common.tail(self.log_path)}")
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server not ready: {common.tail(self.log_path)}")
                await asyncio.sleep(0.1)

    async def seed_ids(self, n: int, path: Path) -> int:
        """Submit ``n`` runs through ``POST /runs/batch`` and write their ids, one a line."""
        one = {"component_type": "task", "component_id": "noop", "payload": PAYLOAD}
        ids: list[str] = []
        async with httpx.AsyncClient(base_url=self.base, timeout=30, headers=self.headers) as c:
            while len(ids) < n:
                k = min(BATCH_SIZE, n - len(ids))
                r = await c.post("/runs/batch", json={"items": [one] * k})
                r.raise_for_status()
                ids += [item["run_id"] for item in r.json()["items"]]
            probe = await c.get(f"/runs/{ids[0]}")
            probe.raise_for_status()
        path.write_text("\n".join(ids) + "\n")  # noqa: ASYNC240 - once, before any load
        return len(ids)

    def stop(self) -> int | None:
        return common.stop_process(self.proc) if self.proc is not None else None


def wrk(
    server: Server,
    mode: str,
    connections: int,
    seconds: float,
    files: dict[str, Path],
    cpu: str | None,
) -> dict[str, Any]:
    env = common.env_with(
        W5_MODE=mode,
        W5_BODY_FILE=str(files["batch" if mode == "batch" else "post"]),
        W5_IDS_FILE=str(files["ids"]),
        W5_AUTH=server.headers.get("Authorization", ""),
    )
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
    cmd += ["-s", str(W5_DIR / "wrk.lua"), server.base]
    out = subprocess.run(pinned(cmd, cpu), env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("W5JSON ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr}")
    result: dict[str, Any] = json.loads(lines[-1][7:])
    return result


def summarize(raw: dict[str, Any], mode: str, cpu_s: float | None) -> dict[str, Any]:
    n = raw["requests"]
    rps = n / raw["seconds"] if raw["seconds"] else 0.0
    errors = sum(raw[k] for k in raw if k.startswith("errors_"))
    if n == 0:
        # Not one response within the run (too short for this load): no latency to report.
        return {"rps": 0.0, "requests": 0, "errors": errors}
    out = {
        "rps": round(rps, 1),
        "p50_ms": round(raw["lat_p50_us"] / 1000, 3),
        "p90_ms": round(raw["lat_p90_us"] / 1000, 3),
        "p99_ms": round(raw["lat_p99_us"] / 1000, 3),
        "max_ms": round(raw["lat_max_us"] / 1000, 3),
        "requests": n,
        "errors": errors,
        "server_cpu_ms_per_req": round(cpu_s * 1000 / n, 4) if cpu_s is not None and n else None,
    }
    if mode == "batch":
        out["runs_per_s"] = round(rps * BATCH_SIZE, 1)
    return out


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    workdir = Path(args.logdir) / f"w5_{args.system}_{args.engine}_{args.auth}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    server_cpu, wrk_cpu = cpu_pins()
    post, batch = bodies(workdir)
    files = {"post": post, "batch": batch, "ids": workdir / "ids.txt"}
    server = Server(args, workdir, server_cpu)
    server.start()
    res: dict[str, Any] = {}
    try:
        await server.wait_ready()
        assert server.proc is not None
        pid = server.proc.pid
        scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        if "get" in scenarios:
            res["get_ids"] = await server.seed_ids(args.ids, files["ids"])
        for mode in scenarios:
            for c in (int(x) for x in args.connections.split(",")):
                name = f"{mode}_c{c}"
                if args.warmup > 0:
                    wrk(server, mode, c, args.warmup, files, wrk_cpu)
                spy_out = args.pyspy if args.pyspy and name == args.pyspy_scenario else None
                spy = common.PySpy(spy_out, pid)
                cpu0 = common.proc_cpu_seconds(pid)
                try:
                    raw = wrk(server, mode, c, args.duration, files, wrk_cpu)
                finally:
                    cpu1 = common.proc_cpu_seconds(pid)
                    spy.stop()
                used = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
                summary = summarize(raw, mode, used)
                common.log(f"{name}: {summary}")
                res.update({f"{name}_{k}": v for k, v in summary.items()})
    finally:
        code = server.stop()
    res.update(
        system=args.system,
        engine=args.engine,
        auth=args.auth,
        server_exit=code,
        pinning={"server_cpu": server_cpu, "wrk_cpu": wrk_cpu},
        duration_s=args.duration,
    )
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", nargs="?", default="run", choices=["run"])
    p.add_argument("--system", choices=["runq", "floor", "asgi"], default="runq")
    p.add_argument("--engine", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--auth", choices=["open", "key"], default="open")
    p.add_argument("--dsn", default=os.environ.get("RUNQ_BENCH_DSN", ""))
    p.add_argument("--logdir", default="/tmp")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measured wrk run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of discarded wrk first")
    p.add_argument("--connections", default="16,64")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--ids", type=int, default=1000, help="runs submitted first for GET")
    p.add_argument("--pyspy", default=None, help="py-spy the server into this file")
    p.add_argument("--pyspy-scenario", default="post_c16", help="the scenario to profile")
    p.add_argument("--runs", type=int, default=0, help="unused (run.py passes it)")
    args = p.parse_args()
    if args.engine == "postgres" and not args.dsn:
        p.error("--dsn is required for PostgreSQL")
    common.emit(asyncio.run(run_all(args)))


if __name__ == "__main__":
    main()
