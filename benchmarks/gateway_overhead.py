"""The latency a replica router adds, as its client sees it: Canopy's gateway
(``canopy serve router``, the ``canopy`` replica policy, ``approximate`` index) beside
sglang-router and vllm-router (the real binaries, ``cache_aware``), each in front of the same
two loopback echo upstreams, auth on, non-streamed chats. One run, interleaved: every round
sends one request direct to an upstream and one through each router, in a shuffled order, one
at a time over kept-alive connections. Reported per router: the added latency (its p50 and
p99 minus the direct call's), and its process's CPU time per request. Prints JSON::

    PYTHONPATH=src python benchmarks/gateway_overhead.py --rounds 3000

``--also-src DIR`` adds a second Canopy gateway, ``canopy@DIR``, run from the sources in
``DIR`` (another checkout's ``src``: before and after a change, in one interleaved run).
``--echo PORT`` runs one echo upstream (what the benchmark starts twice). A router whose
binary is missing is left out (listed under ``"missing"``).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

KEY = "bench-client-key-1"
ADMIN = "bench-admin-key-2"
PROMPT = ("You are a helpful assistant answering questions about the weather in short, plain "
          "sentences. " * 3 + "What is the weather like today?")
BODY = json.dumps({"model": "echo", "messages": [{"role": "user", "content": PROMPT}],
                   "max_tokens": 8}).encode()
ANSWER = json.dumps({"id": "chatcmpl-echo", "object": "chat.completion", "created": 0,
                     "model": "echo", "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant",
                                                               "content": "Sunny."}}],
                     "usage": {"prompt_tokens": 40, "completion_tokens": 2,
                               "total_tokens": 42,
                               "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "echo", "object": "model"}]}).encode()


# -- the echo upstream ---------------------------------------------------------------------
class _Echo(asyncio.Protocol):
    """HTTP/1.1 with keep-alive: every POST gets :data:`ANSWER`, every GET :data:`MODELS`."""

    def connection_made(self, transport: Any) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            body = ANSWER if head[0].startswith("POST") else MODELS
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def echo(port: int) -> None:
    """Serve the echo upstream on 127.0.0.1:``port`` until killed."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(run())


# -- processes -------------------------------------------------------------------------------
def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(port: int, process: subprocess.Popen[bytes], path: str, timeout: float = 120.0,
          auth: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("POST", path, BODY, {"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {KEY}"}
                                                 if auth else {})})
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{process.args} did not answer within {timeout:g} s")


def _canopy(port: int, upstreams: list[str], folder: Path, log: Any, src: str | None = None
            ) -> subprocess.Popen[bytes]:
    config = {"upstreams": [{"model": "echo", "replicas": upstreams, "timeout_s": 30,
                             "replica_policy": "canopy",
                             "index": {"mode": "approximate", "block_size": 16}}],
              "store": "memory", "lam": 1.0,
              "prices": {"version": "bench-1", "models": {"echo": {"input": 0.01,
                                                                   "output": 0.01}}},
              "auth": {"client_key_env": "BENCH_CLIENT_KEY", "admin_key_env": "BENCH_ADMIN_KEY"}}
    path = folder / "gateway.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "BENCH_CLIENT_KEY": KEY, "BENCH_ADMIN_KEY": ADMIN}
    if src is not None:
        env["PYTHONPATH"] = src
    return subprocess.Popen([sys.executable, "-m", "canopy", "serve", "router", "--config",
                             str(path), "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=log)


def _peer(binary: str, port: int, upstreams: list[str], log: Any) -> subprocess.Popen[bytes]:
    args = [binary, "launch"] if binary.endswith("sglang-router") else [binary]
    return subprocess.Popen([*args, "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                             *[u.removesuffix("/v1") for u in upstreams], "--policy",
                             "cache_aware", "--api-key", KEY, "--log-level", "error",
                             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_port())],
                            stdout=log, stderr=log, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _binary(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


# -- the measurement -------------------------------------------------------------------------
def _client(port: int, path: str, auth: bool) -> Callable[[], float]:
    """One request's round trip (s) over a kept-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = f"Bearer {KEY}"

    def ask() -> float:
        t0 = time.perf_counter()
        conn.request("POST", path, BODY, headers)
        answer = conn.getresponse()
        data = answer.read()
        took = time.perf_counter() - t0
        if answer.status != 200 or b"choices" not in data:
            raise RuntimeError(f"port {port}: {answer.status} {data[:200]!r}")
        return took
    return ask


def measure(*, rounds: int = 3000, warmup: int = 200, seed: int = 0,
            peers: tuple[str, ...] = ("sglang-router", "vllm-router"),
            also_src: str | None = None) -> dict[str, Any]:
    """The figures of the module's docstring, as a dict."""
    rng = random.Random(seed)
    folder = Path(tempfile.mkdtemp(prefix="gateway-overhead-"))
    log = (folder / "routers.log").open("wb")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        ports = [_port(), _port()]
        upstreams = [f"http://127.0.0.1:{p}/v1" for p in ports]
        for p in ports:
            processes.append(subprocess.Popen([sys.executable, __file__, "--echo", str(p)]))
        for p, process in zip(ports, processes, strict=True):
            _wait(p, process, "/v1/chat/completions", auth=False)
        routers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
        port = _port()
        routers["canopy"] = (port, _canopy(port, upstreams, folder, log))
        if also_src is not None:
            port = _port()
            routers[f"canopy@{also_src}"] = (port, _canopy(port, upstreams, folder, log,
                                                           also_src))
        missing = []
        for name in peers:
            binary = _binary(name)
            if binary is None:
                missing.append(name)
                continue
            port = _port()
            routers[name] = (port, _peer(binary, port, upstreams, log))
        for port, process in routers.values():
            processes.append(process)
            _wait(port, process, "/v1/chat/completions")
        clients = {"direct": _client(ports[0], "/v1/chat/completions", auth=True)}
        clients.update({name: _client(port, "/v1/chat/completions", auth=True)
                        for name, (port, _) in routers.items()})
        names = list(clients)
        for _ in range(warmup):
            for name in names:
                clients[name]()
        times: dict[str, list[float]] = {name: [] for name in names}
        cpu0 = {name: _cpu_s(process.pid) for name, (_, process) in routers.items()}
        for _ in range(rounds):
            rng.shuffle(names)
            for name in names:
                times[name].append(clients[name]())
        cpu = {name: _cpu_s(process.pid) - cpu0[name] for name, (_, process) in routers.items()}
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
    ms = {name: 1000.0 * np.asarray(t) for name, t in times.items()}
    direct50, direct99 = np.percentile(ms["direct"], [50, 99])
    results = {}
    for name in routers:
        p50, p99 = np.percentile(ms[name], [50, 99])
        results[name] = {"p50_ms": float(p50), "p99_ms": float(p99),
                         "added_p50_ms": float(p50 - direct50),
                         "added_p99_ms": float(p99 - direct99),
                         "cpu_ms_per_request": 1000.0 * cpu[name] / rounds}
    out: dict[str, Any] = {"rounds": rounds, "direct": {"p50_ms": float(direct50),
                                                        "p99_ms": float(direct99)},
                           "results": results, "missing": missing}
    if "sglang-router" in results:
        out["canopy_over_sglang_added_p50"] = (results["canopy"]["added_p50_ms"]
                                               / results["sglang-router"]["added_p50_ms"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peers", default="sglang-router,vllm-router",
                        help="comma-separated peer routers ('' for none)")
    parser.add_argument("--also-src", default=None,
                        help="another Canopy source tree to run a second gateway from")
    parser.add_argument("--echo", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo is not None:
        echo(args.echo)
        return
    peers = tuple(p for p in args.peers.split(",") if p)
    print(json.dumps(measure(rounds=args.rounds, warmup=args.warmup, seed=args.seed,
                             peers=peers, also_src=args.also_src), indent=1))


if __name__ == "__main__":
    main()
