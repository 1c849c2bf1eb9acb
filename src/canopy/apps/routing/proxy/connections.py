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
* The app's hot routes (:class:`LeanRoutes`: the proxy's chats) are answered by the httptools
  protocol itself: the body read there (kept up to the app's bound, the rest discarded),
  the handler awaited, its answer written in one piece, with no ASGI scope, cycle or message
  per request. A pipelined request, ``Expect: 100-continue`` or an upgrade takes uvicorn's
  own path; a streamed answer is handed to uvicorn's cycle to send.
* The log is bounded: each message of the ``asyncio``, ``uvicorn.error`` and
  ``canopy.proxy`` loggers is written at most ``burst`` times per ``window_s``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from canopy.apps.routing.proxy.config import Limits

__all__ = ["ConnectionGuard", "GuardedH11Protocol", "GuardedHttpToolsProtocol", "LeanRoutes",
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


Handler = Callable[[list[tuple[bytes, bytes]], "bytes | None"], Awaitable[Any]]


@dataclass(frozen=True)
class LeanRoutes:
    """``POST`` paths the protocol answers itself (an app's ``lean_routes``): each handler
    takes the request's headers (lower-case names, as parsed) and its body (``None`` when
    it passed ``max_body_bytes``) and returns a Starlette response. A whole answer's
    ``after`` (when set: a callable of no arguments) is called once the answer is written
    (or its client has gone), before the connection's next request is read: the handler's
    bookkeeping, off the client's path."""

    handlers: Mapping[bytes, Handler]
    max_body_bytes: int


class _Unused:
    """What uvicorn's protocol signals on a lean request's event: nothing waits on it."""

    def set(self) -> None:
        pass


class _LeanCycle:
    """A request on a lean route, as uvicorn's protocol sees its cycle (the fields it reads
    and sets: body state, completion, disconnection, keep-alive)."""

    message_event = _Unused()

    def __init__(self, handler: Handler, path: bytes, headers: list[tuple[bytes, bytes]], *,
                 keep_alive: bool, too_large: bool) -> None:
        self.handler, self.path, self.headers = handler, path, headers
        self.keep_alive = keep_alive
        self.body = bytearray()
        self.too_large = too_large
        self.more_body = True
        self.response_complete = self.disconnected = False


def _head(status: int, headers: Any) -> list[bytes]:
    """An answer's status line and headers, unterminated; ``ValueError`` for a header value
    that would split the answer."""
    content = [STATUS_LINE[status]]
    for name, value in headers:
        content += [name, b": ", value, b"\r\n"]
    values = b"".join(content[3::4])  # every value, checked at once
    if b"\r" in values or b"\n" in values:
        name = next(n for n, v in headers if b"\r" in v or b"\n" in v)
        raise ValueError(f"the header {name!r} holds a line break")
    return content


class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, in C: the fast one), guarded, its request line
    and headers bounded by ``limits.max_header_bytes`` as h11's are (400 past it); the app's
    :class:`LeanRoutes` answered here (see the module docstring)."""

    _header_bytes = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean: LeanRoutes | None = getattr(self.app, "lean_routes", None)

    def on_message_begin(self) -> None:
        # uvicorn's own, less its ASGI scope: made only for a request it serves (_scope)
        self.url, self.headers, self.expect_100_continue = b"", [], False
        self.scope = None  # type: ignore[assignment]
        self._header_bytes = 0

    def _scope(self) -> None:
        """uvicorn's ASGI scope of the request being parsed (its headers and URL kept)."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers

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

    # -- lean routes ------------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        lean = self.lean
        handler = None if lean is None else lean.handlers.get(self.url)
        if lean is None or handler is None or self.parser.get_method() != b"POST" or \
                self.expect_100_continue or self.parser.should_upgrade() or \
                (self.cycle is not None and not self.cycle.response_complete):
            self._scope()
            super().on_headers_complete()
            return
        declared = next((v for n, v in self.headers if n == b"content-length"), b"")
        too_large = declared.isdigit() and int(declared) > lean.max_body_bytes
        keep_alive = self.parser.get_http_version() != "1.0" and \
            self.parser.should_keep_alive() and not too_large  # its body is left unread
        self.cycle = _LeanCycle(handler, self.url, self.headers,  # type: ignore[assignment]
                                keep_alive=keep_alive, too_large=too_large)
        if too_large:  # answered at once, as the app answers a declared oversized body
            self.cycle.more_body = False
            self._lean_start(self.cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if not isinstance(cycle, _LeanCycle):
            super().on_body(body)
        elif not cycle.too_large:
            cycle.body += body
            if len(cycle.body) > self.lean.max_body_bytes:  # type: ignore[union-attr]
                cycle.too_large, cycle.body = True, bytearray()

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if not isinstance(cycle, _LeanCycle):
            super().on_message_complete()
        elif cycle.more_body:
            cycle.more_body = False
            self._lean_start(cycle)

    def _lean_start(self, cycle: _LeanCycle) -> None:
        task = self.loop.create_task(self._lean_run(cycle))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _lean_run(self, cycle: _LeanCycle) -> None:
        after = None
        try:
            answer = await cycle.handler(cycle.headers,
                                         None if cycle.too_large else bytes(cycle.body))
            if not isinstance(getattr(answer, "body", None), bytes):  # a stream: uvicorn's
                await self._hand_over(cycle, answer)
                return
            after = getattr(answer, "after", None)
            content = _head(answer.status_code,
                            (*self.server_state.default_headers, *answer.raw_headers))
            body = answer.body
        except Exception:  # as uvicorn does for an app's failure: log, answer 500
            logging.getLogger("canopy.proxy").exception("the proxy failed on a lean route")
            cycle.keep_alive = False
            content = _head(500, [(b"content-type", b"text/plain; charset=utf-8"),
                                  (b"content-length", b"21")])
            body = b"Internal Server Error"
        try:
            if cycle.disconnected:
                return
            if not cycle.keep_alive:
                content.append(b"connection: close\r\n")
            content += [b"\r\n", body]
            self.transport.write(b"".join(content))
            cycle.response_complete = True
            if not cycle.keep_alive:
                self.transport.close()
            self.on_response_complete()
        finally:
            if after is not None:  # the handler's bookkeeping, off the client's path
                try:
                    after()
                except Exception:
                    logging.getLogger("canopy.proxy").exception(
                        "the proxy's bookkeeping failed after an answer")

    async def _hand_over(self, cycle: _LeanCycle, answer: Any) -> None:
        """Send ``answer`` (an ASGI response: a stream) through a uvicorn cycle."""
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": "1.1", "server": self.server, "client": self.client,
                 "scheme": self.scheme, "root_path": "", "headers": cycle.headers,
                 "method": "POST", "path": cycle.path.decode("latin-1"),
                 "raw_path": cycle.path, "query_string": b"", "state": {}}
        served = RequestResponseCycle(
            scope=scope, transport=self.transport, flow=self.flow,  # type: ignore[arg-type]
            logger=self.logger, access_logger=self.access_logger,
            access_log=self.access_log, default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(), expect_100_continue=False,
            keep_alive=cycle.keep_alive, on_response=self.on_response_complete)
        served.more_body, served.disconnected = False, cycle.disconnected
        if self.cycle is cycle:
            self.cycle = served
        await served.run_asgi(answer)


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
