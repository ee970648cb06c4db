#!/opt/runq/bin/python3 -I
"""``runq-probe [PATH]``: exit 0 when runq's HTTP API answers PATH with 2xx, 1 otherwise.

The image installs this file as ``/usr/local/bin/runq-probe``. It is the image's
HEALTHCHECK (``runq-probe /readyz``) and the Kubernetes manifest's exec probes
(``/healthz`` for liveness, ``/readyz`` for readiness). An exec probe works the same
under every runner: ``podman kube play`` turns an ``httpGet`` probe into a ``curl``
command run inside the container, and the image has no curl.

The port is the one runq listens on, read as runq reads it: ``RUNQ_HTTP_LISTEN``, else
``[http] listen`` of the file named by ``RUNQ_CONFIG``, else ``127.0.0.1:7777``. A
wildcard listen address (``0.0.0.0``, ``::``) is probed on loopback. Only the standard
library is used, so the probe starts fast and never imports runq.
"""

from __future__ import annotations

import os
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping

DEFAULT_LISTEN = "127.0.0.1:7777"
TIMEOUT_SECONDS = 4.0
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def listen_address(environ: Mapping[str, str]) -> str:
    """runq's ``http.listen``: the environment first, then the config file, then the default."""
    if environ.get("RUNQ_HTTP_LISTEN"):
        return environ["RUNQ_HTTP_LISTEN"]
    config = environ.get("RUNQ_CONFIG")
    if config:
        try:
            with open(config, "rb") as f:
                http = tomllib.load(f).get("http", {})
        except (OSError, tomllib.TOMLDecodeError):
            return DEFAULT_LISTEN  # runq itself would refuse to start; the probe just fails
        listen = http.get("listen") if isinstance(http, dict) else None
        if isinstance(listen, str) and listen:
            return listen
    return DEFAULT_LISTEN


def probe_url(listen: str, path: str) -> str:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    host = WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    path = argv[1] if len(argv) > 1 else "/readyz"
    if not path.startswith("/"):
        print(f"runq-probe: {path!r} is not a path (e.g. /readyz)", file=sys.stderr)
        return 2
    url = probe_url(listen_address(environ), path)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            status = int(response.status)
    except urllib.error.HTTPError as e:
        status = e.code
    except (OSError, ValueError) as e:
        print(f"runq-probe: {url}: {e}", file=sys.stderr)
        return 1
    if 200 <= status < 300:
        return 0
    print(f"runq-probe: {url}: HTTP {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv, os.environ))
