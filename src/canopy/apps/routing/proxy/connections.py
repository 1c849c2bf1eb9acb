"""What a client can hold open: the proxy's HTTP connections, bounded under uvicorn.

* A client has ``limits.client_timeout_s`` to send a whole request (headers and body) after it
  connects or after its previous answer; then its connection is closed (slow-loris clients
  that drip a header byte at a time never hold one longer).
* At most ``limits.max_connections`` connections are open, and never more than the process's
  open-file limit leaves room for (raised to its hard limit at start; room is kept for the
  upstream connection pools and the store). A connection past the cap closes the oldest one
  still sending its request (a legitimate request is served even while slow clients fill the
  table); when every open connection is being served, the new one is closed.
* Headers are bounded by ``limits.max_header_bytes`` (400 past it), idle keep-alive
  connections close after ``limits.keep_alive_s``.
* Requests are parsed by httptools (llhttp, in C) on uvloop's event loop (asyncio's own
  where uvloop is not built); :class:`GuardedH11Protocol` is the same guard over h11.
* The log is bounded: each message of the ``asyncio``, ``uvicorn.error`` and
  ``canopy.proxy`` loggers is written at most ``burst`` times per ``window_s``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from canopy.apps.routing.proxy.config import Limits

__all__ = ["ConnectionGuard", "GuardedH11Protocol", "GuardedHttpToolsProtocol",
           "RateLimitedLog", "bound_logs", "serve", "uvicorn_config"]

RESERVED_FILES = 32          # the store, the log, the listening socket, imports
UPSTREAM_POOL = 64           # connections per upstream (AsyncPassthrough's pool)
GUARDED_LOGGERS = ("asyncio", "uvicorn.error", "canopy.proxy")


def open_file_limit() -> int:
    """The soft limit on open files, raised to the hard limit first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


@dataclass(frozen=True)
class ConnectionGuard:
    """How many connections the server keeps and how long a client may take to send a
    request (see the module docstring)."""

    max_connections: int
    client_timeout_s: float
    max_header_bytes: int = 16384

    @classmethod
    def for_limits(cls, limits: Limits, *, upstreams: int) -> ConnectionGuard:
        """The configured cap, lowered to what the open-file limit leaves room for."""
        room = open_file_limit() - RESERVED_FILES - UPSTREAM_POOL * upstreams
        return cls(max(8, min(limits.max_connections, room)), limits.client_timeout_s,
                   limits.max_header_bytes)


_WAITING: WeakKeyDictionary[Any, OrderedDict[Any, None]] = WeakKeyDictionary()


class _Guarded:
    """A request timeout and a connection cap (:class:`ConnectionGuard`, read from the
    uvicorn config's ``canopy_guard``) over either of uvicorn's HTTP/1.1 protocols."""

    cycle: Any
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]
        self.guard: ConnectionGuard = config.canopy_guard
        # connections still sending a request, oldest first (one table per server)
        self.waiting = _WAITING.setdefault(server_state, OrderedDict())
        self._timer: asyncio.TimerHandle | None = None
        self._answered: Any = None  # the cycle before the request being received

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.guard.max_connections:
            oldest = next(iter(self.waiting), None)
            if oldest is None:  # every connection is being served: refuse this one
                self._close()
                return
            oldest._close()
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._answered = self.cycle
        self.waiting[self] = None
        self._timer = self.loop.call_later(self.guard.client_timeout_s, self._close)

    def _disarm(self) -> None:
        self.waiting.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self._timer is not None and self.cycle is not None and \
                self.cycle is not self._answered and not self.cycle.more_body:
            self._disarm()  # the whole request is in: the proxy's deadline takes over

    def on_response_complete(self) -> None:
        answered = self.cycle
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.cycle is not answered and not self.cycle.more_body:
            return  # a pipelined request, already complete
        self._arm()
        self._answered = answered

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]


class GuardedH11Protocol(_Guarded, H11Protocol):
    """uvicorn's h11 protocol, guarded (its headers bounded by h11's incomplete-event
    size)."""


class HeadersTooLarge(ValueError):
    """A request's line and headers passed ``limits.max_header_bytes`` (answered 400)."""


class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, in C: the fast one), guarded, its request line
    and headers bounded by ``limits.max_header_bytes`` as h11's are (400 past it)."""

    _header_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.guard.max_header_bytes:
            raise HeadersTooLarge("the request's headers are too large")

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)


class RateLimitedLog(logging.Filter):
    """Passes each message (logger and format string) at most ``burst`` times per
    ``window_s``; the first one passed after a window that dropped some says how many."""

    def __init__(self, burst: int = 20, window_s: float = 60.0) -> None:
        super().__init__()
        self.burst, self.window_s = burst, window_s
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] > self.window_s:
            dropped = 0 if entry is None else int(entry[2])
            if len(self._seen) > 1000:  # bounded, like everything else
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = f"[{dropped} more like this dropped] {record.msg}"
            return True
        if entry[1] < self.burst:
            entry[1] += 1
            return True
        entry[2] += 1
        return False


def bound_logs() -> None:
    """Rate-limit the loggers a flood of connections writes to (once per process)."""
    for name in GUARDED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedLog) for f in logger.filters):
            logger.addFilter(RateLimitedLog())


def uvicorn_config(app: Any, limits: Limits, *, upstreams: int, host: str, port: int,
                   workers: int = 1) -> Any:
    """A ``uvicorn.Config`` serving ``app`` (an app, or the import string of a factory when
    ``workers > 1``) under these limits; also bounds the log (:func:`bound_logs`)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            workers=workers, factory=isinstance(app, str),
                            http=GuardedHttpToolsProtocol, loop=_loop(), backlog=2048,
                            proxy_headers=False,  # the proxy reads no client address
                            h11_max_incomplete_event_size=limits.max_header_bytes,
                            timeout_keep_alive=limits.keep_alive_s)
    config.canopy_guard = ConnectionGuard.for_limits(limits, upstreams=upstreams)
    bound_logs()
    return config


def _loop() -> str:
    """uvloop when installed (the serve extra), else asyncio's own loop."""
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover
        return "asyncio"
    return "uvloop"


def serve(config: Any) -> None:
    """Run a :func:`uvicorn_config` until stopped: one process, or its ``workers`` processes
    on one socket."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if config.workers > 1:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    else:
        uvicorn.Server(config).run()
