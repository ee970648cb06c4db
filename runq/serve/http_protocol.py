"""uvicorn's HTTP/1.1 (h11) protocol with a deadline for receiving each request.

uvicorn waits forever for a request's headers and body. A client that trickles bytes, or
opens connections and sends nothing, holds each one for good (slowloris); enough of them
use up the process's file descriptors, and with them every other client and the database
connections. Here every request must arrive completely, headers and body, within
``[http] request_timeout_seconds`` of the connection opening or of the previous response.
A request still incomplete then is answered ``408`` (unless a response already started)
and its connection closed; the application sees a client disconnect. A request that has
fully arrived is never timed out here: its handler answers in its own time.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_BODY = b'{"error":"request_timeout","detail":"the request did not arrive in time"}'
TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)
#: h11 states of the client's side in which its request is still arriving.
_RECEIVING = (h11.IDLE, h11.SEND_BODY)


def protocol_with_request_timeout(seconds: float) -> type[H11Protocol]:
    """An ``H11Protocol`` class for ``uvicorn.Config(http=...)`` with this deadline."""

    class RequestTimeoutProtocol(H11Protocol):
        _request_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request on this connection gets its own deadline

        def _arm(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self._request_deadline = self.loop.call_later(seconds, self._timed_out)

        def _disarm(self) -> None:
            if self._request_deadline is not None:
                self._request_deadline.cancel()
                self._request_deadline = None

        def _timed_out(self) -> None:
            self._request_deadline = None
            if self.transport.is_closing() or self.conn.their_state not in _RECEIVING:
                return
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                # No response has started: say why before closing.
                self.transport.write(TIMEOUT_RESPONSE)
            self.transport.close()

    return RequestTimeoutProtocol
