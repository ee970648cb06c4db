"""The application beside runq in packaging/kubernetes/runq-sidecar.yaml: standard library
only, so its image is the base image plus this file.

It plays both sides of the sidecar contract (docs/sidecar.md) over the pod's loopback:

- it submits runs: ``POST /documents/{name}/render`` on its public port sends
  ``POST {RUNQ_URL}/runs`` with the bearer key and answers 202 with the run id;
  ``GET /runs/{id}`` on the public port relays runq's view of the run;
- it serves the work: runq's ``kind = "http"`` component calls ``POST /render`` on the
  callback port, which listens on 127.0.0.1 only, so nothing outside the pod can call it.
  A payload's ``seconds`` (at most 60) makes the render take that long.

Shutdown (SIGTERM): the public port closes at once (no new submissions), but the
callback port stays open until runq has drained and exited (its ``/healthz`` stops
answering) or ``APP_DRAIN_SECONDS`` pass: runq finishes the renders it is waiting on
instead of finding the application gone in the middle of its drain.

Environment: ``RUNQ_URL`` (http://127.0.0.1:7777), ``RUNQ_API_KEY`` (required),
``APP_LISTEN`` (0.0.0.0:8080), ``APP_CALLBACK_LISTEN`` (127.0.0.1:8081),
``APP_DRAIN_SECONDS`` (40).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RUNQ_URL = os.environ.get("RUNQ_URL", "http://127.0.0.1:7777").rstrip("/")
API_KEY = os.environ.get("RUNQ_API_KEY", "")
DRAIN_SECONDS = float(os.environ.get("APP_DRAIN_SECONDS", "40"))
MAX_RENDER_SECONDS = 60.0
NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
RUN_ID = re.compile(r"^[0-9a-f-]{36}$")


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"app": event, **fields}), flush=True)


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def runq(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to runq's API over loopback; (status, decoded JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{RUNQ_URL}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {API_KEY}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Handler(BaseHTTPRequestHandler):
    server_version = "example-app"

    def reply(self, status: int, body: Any) -> None:
        text = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= 1_000_000:
            raise ValueError("body too large")
        return json.loads(self.rfile.read(length) or b"null")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one JSON line per event instead (log())


class Public(Handler):
    """The application's own API: what its users (and the test) call."""

    def do_GET(self) -> None:
        if self.path == "/healthz":
            return self.reply(200, {"status": "ok"})
        match = re.fullmatch(r"/runs/([^/]+)", self.path)
        if match and RUN_ID.match(match.group(1)):
            status, body = runq("GET", f"/runs/{match.group(1)}")
            return self.reply(status, body)
        return self.reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        match = re.fullmatch(r"/documents/([^/]+)/render", self.path)
        if not match or not NAME.match(match.group(1)):
            return self.reply(404, {"error": "not found"})
        try:
            options = self.read_json() or {}
            seconds = float(options.get("seconds", 0)) if isinstance(options, dict) else 0.0
        except (ValueError, TypeError):
            return self.reply(400, {"error": 'body must be JSON, e.g. {"seconds": 2}'})
        payload = {"document": match.group(1), "seconds": min(max(seconds, 0.0), 60.0)}
        submission = {"component_type": "task", "component_id": "render", "payload": payload}
        try:
            status, body = runq("POST", "/runs", submission)
        except OSError as e:
            log("submit.failed", error=str(e))
            return self.reply(503, {"error": "runq is not reachable"})
        if status >= 300:
            log("submit.refused", status=status, body=body)
            return self.reply(502, {"error": "runq refused the run", "runq": body})
        log("submitted", run_id=body["run_id"], document=payload["document"])
        return self.reply(202, {"run_id": body["run_id"]})


class Callback(Handler):
    """What runq calls for every run of ``task/render`` (kind = "http")."""

    def do_POST(self) -> None:
        if self.path != "/render":
            return self.reply(404, {"error": "not found"})
        run_id = self.headers.get("Runq-Run-Id", "")
        attempt = self.headers.get("Runq-Attempt", "")
        try:
            payload = self.read_json()
            document = str(payload["document"])
            seconds = min(max(float(payload.get("seconds", 0)), 0.0), MAX_RENDER_SECONDS)
        except (ValueError, TypeError, KeyError):
            # A 4xx fails the run for good in runq: a bad payload never gets better.
            return self.reply(422, {"error": "payload.document is required"})
        log("render.started", run_id=run_id, attempt=attempt, document=document)
        time.sleep(seconds)
        log("render.finished", run_id=run_id, attempt=attempt)
        return self.reply(
            200, {"html": f"<h1>{document}</h1>", "rendered_by": socket.gethostname()}
        )


def runq_is_up() -> bool:
    try:
        with urllib.request.urlopen(f"{RUNQ_URL}/healthz", timeout=2):
            return True
    except OSError:
        return False


def main() -> int:
    if not API_KEY:
        print("RUNQ_API_KEY is required (the Secret's api-key)", file=sys.stderr)
        return 2
    public = ThreadingHTTPServer(split_listen(os.environ.get("APP_LISTEN", "0.0.0.0:8080")), Public)
    callback = ThreadingHTTPServer(
        split_listen(os.environ.get("APP_CALLBACK_LISTEN", "127.0.0.1:8081")), Callback
    )
    for server in (public, callback):
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    log("listening", public=public.server_address[1], callback=callback.server_address[1])

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass

    public.shutdown()
    log("draining", waiting_for="runq to exit", at_most_seconds=DRAIN_SECONDS)
    deadline = time.monotonic() + DRAIN_SECONDS
    while runq_is_up() and time.monotonic() < deadline:
        time.sleep(0.5)
    callback.shutdown()
    log("stopped", runq_still_up=runq_is_up())
    return 0


if __name__ == "__main__":
    sys.exit(main())
