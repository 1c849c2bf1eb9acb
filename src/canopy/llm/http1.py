"""A lean HTTP/1.1 client for one plain-HTTP origin: kept-alive connections (at most
``max_connections``), a whole request written in one piece, the answer parsed by httptools
(llhttp, in C) and read whole up to a cap. It serves the proxy's non-streamed upstream calls
(:class:`~canopy.llm.passthrough.AsyncPassthrough`), where ``httpx`` cost about 0.8 ms of CPU
per call on the benchmark's machine and this client about 0.03 ms (``docs/fleet.md``,
"Overhead beside sglang-router and vllm-router"). Streams, TLS and proxies stay with ``httpx``.

Failures are the client's error types (:mod:`canopy.llm.client`): unreachable or a connection
lost mid-answer (:class:`~canopy.llm.client.LLMConnectionError`), past the timeout
(:class:`~canopy.llm.client.LLMTimeoutError`), an answer that is not HTTP
(:class:`~canopy.llm.client.LLMResponseError`), larger than the cap (:class:`AnswerTooLarge`).
A connection that failed, timed out or was cut is closed, never reused; a kept-alive one the
origin closed while idle is replaced once, before any of its answer arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

from canopy.llm.client import (
    AnswerTooLarge,
    LLMConnectionError,
    LLMResponseError,
    LLMTimeoutError,
)

__all__ = ["Answer", "Http1Pool", "Once"]


class Once:
    """A callback called at most once (``None``: nothing)."""

    __slots__ = ("_call",)

    def __init__(self, call: Callable[[], None] | None) -> None:
        self._call = call

    def __call__(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call()


class _Cut(Exception):
    """The connection closed before the answer's first byte (a kept-alive connection the
    origin had closed: the request may be sent again on a new one)."""


Answer = tuple[int, bytes]
"""An answer's status and body."""


class _Connection(asyncio.Protocol):
    """One kept-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[Answer] | None = None
        self.open = True
        self._reset(0)

    def _reset(self, cap: int) -> None:
        self.cap, self.body, self.started = cap, bytearray(), False
        self.headers_done = self.framed = self.keep_alive = False

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:  # a callback's own failure
            self._fail(error.__cause__ or error.__context__ or error)
        except httptools.HttpParserError as error:
            self._fail(LLMResponseError(f"the upstream's answer is not HTTP/1.1: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.answer is None or self.answer.done():
            return
        if self.headers_done and not self.framed:  # read until closed: it ended
            self._finish()
        elif not self.started:
            self.answer.set_exception(_Cut())
        else:
            self._fail(LLMConnectionError("the upstream closed the connection mid-answer"))

    # -- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.framed = True
            if value.strip().isdigit() and int(value) > self.cap:
                raise AnswerTooLarge(f"the answer declares {int(value)} bytes, over the "
                                     f"{self.cap}-byte cap")
        elif name == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body += body
        if len(self.body) > self.cap:
            raise AnswerTooLarge(f"the answer exceeds the {self.cap}-byte cap")

    def on_message_complete(self) -> None:
        self._finish()

    # -- outcome ----------------------------------------------------------------------------
    def _finish(self) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((self.parser.get_status_code(), bytes(self.body)))

    def _fail(self, error: BaseException) -> None:
        self.keep_alive = False
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error)
        self.close()

    def close(self) -> None:
        self.open = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class Http1Pool:
    """Kept-alive connections to the origin of ``base_url`` (``http://host:port``), at most
    ``max_connections`` at once (further requests wait for one)."""

    def __init__(self, base_url: str, *, max_connections: int = 64) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the lean client speaks plain http://, got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self._host = parts.netloc.encode("ascii")
        self._heads: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[bytes, bytes]] = {}
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def post(self, path: str, body: bytes, headers: dict[str, str], *, timeout: float,
                   cap: int, written: Callable[[], None] | None = None) -> Answer:
        """POST ``body`` (JSON) to ``path``; the answer's status and body (at most ``cap``
        bytes), within ``timeout`` seconds for the whole call. ``written`` is called once:
        when the request is written, before its answer is awaited (the caller's bookkeeping
        overlaps the origin's work), or, when the call fails before, as it fails."""
        once = Once(written)
        start, end = self._head(path, headers)
        request = b"%s%d%s%s" % (start, len(body), end, body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            if self._slots.locked():  # every connection busy: wait for one, within time
                await asyncio.wait_for(self._slots.acquire(), timeout)
            else:
                await self._slots.acquire()
            try:
                try:
                    return await self._exchange(loop, request, cap, deadline, once,
                                                reused=True)
                except _Cut:  # a kept-alive connection the origin had closed: once more
                    return await self._exchange(loop, request, cap, deadline, once,
                                                reused=False)
            finally:
                self._slots.release()
        except asyncio.TimeoutError:
            raise LLMTimeoutError(f"no whole answer within {timeout:.3g} s") from None
        except _Cut:
            raise LLMConnectionError("the upstream closed the connection before answering"
                                     ) from None
        finally:
            once()  # failed before any write: the caller's bookkeeping still runs, first

    def _head(self, path: str, headers: dict[str, str]) -> tuple[bytes, bytes]:
        """A request's head around its ``Content-Length`` value: made once per path and
        headers (a few: the endpoints and the key), then reused."""
        key = (path, tuple(headers.items()))
        found = self._heads.get(key)
        if found is None:
            lines = b"".join(name.encode("latin-1") + b": " + value.encode("latin-1") + b"\r\n"
                             for name, value in headers.items())
            found = (b"POST " + path.encode("ascii") + b" HTTP/1.1\r\nHost: " + self._host
                     + b"\r\nContent-Type: application/json\r\nContent-Length: ",
                     b"\r\n" + lines + b"\r\n")
            if len(self._heads) < 64:
                self._heads[key] = found
        return found

    async def _exchange(self, loop: asyncio.AbstractEventLoop, request: bytes, cap: int,
                        deadline: float, written: Once, *, reused: bool) -> Answer:
        conn = None
        while reused and self._idle:
            conn = self._idle.pop()
            if conn.open and conn.transport is not None and not conn.transport.is_closing():
                break
            conn = None
        if conn is None:
            conn = await asyncio.wait_for(self._connect(), max(deadline - loop.time(), 0))
        conn._reset(cap)
        conn.answer = loop.create_future()
        # a timer, not wait_for: no task per call
        timer = loop.call_at(deadline, conn._fail, asyncio.TimeoutError())
        try:
            assert conn.transport is not None
            try:
                conn.transport.write(request)
            except RuntimeError:  # closed under us before its connection_lost ran (uvloop)
                raise _Cut from None
            written()
            answer = await conn.answer
        except BaseException:
            conn.close()  # failed, timed out or cancelled: never reused
            raise
        finally:
            timer.cancel()
        if conn.keep_alive and conn.open:
            conn.answer = None
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    async def _connect(self) -> _Connection:
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                _Connection, self.host, self.port)
        except OSError as error:
            raise LLMConnectionError(f"cannot reach {self.host}:{self.port}: "
                                     f"{error.strerror or type(error).__name__}") from None
        return conn

    def close(self) -> None:
        """Close the kept-alive connections."""
        while self._idle:
            self._idle.pop().close()
