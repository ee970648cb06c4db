"""systemd readiness over the ``NOTIFY_SOCKET`` protocol (sd_notify), without libsystemd.

``READY=1`` once migrations ran and the claimers run, ``STOPPING=1`` when the drain
starts, ``WATCHDOG=1`` every ``WATCHDOG_USEC / 2`` when the unit sets ``WatchdogSec``.
The socket may be a path or an abstract name starting with ``@``. Without
``NOTIFY_SOCKET`` every call is a no-op; a send that fails is logged, never raised.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import anyio

from runq.log import get_logger

log = get_logger(__name__)


class SystemdNotifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET", "")
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def _target(self) -> str:
        # '@name' is Linux's abstract namespace: a leading NUL byte on the wire.
        return "\0" + self.address[1:] if self.address.startswith("@") else self.address

    def notify(self, message: str) -> bool:
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never block the event loop: a reader that does not keep up loses a
                # datagram (the next watchdog ping follows), it does not stall heartbeats.
                sock.setblocking(False)
                sock.connect(self._target())
                sock.send(message.encode())
        except BlockingIOError:
            log.debug("systemd.notify_dropped", message=message.split("=")[0])
            return False
        except OSError as e:
            log.warning("systemd.notify_failed", message=message.split("=")[0], error=str(e))
            return False
        return True

    def ready(self) -> bool:
        return self.notify("READY=1\nSTATUS=claiming")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1\nSTATUS=draining")

    async def watchdog_loop(self) -> None:
        """Pet the watchdog while the event loop is alive (a stuck loop misses it)."""
        if self.watchdog_interval is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await anyio.sleep(self.watchdog_interval)


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # meant for another process (e.g. a wrapper)
    return int(usec) / 1_000_000 / 2
