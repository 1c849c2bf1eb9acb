"""Routing benchmarks: replay speed (pytest-benchmark), and the proxy's 1,000-request load
test (32 at a time, one of two llama-cpp-python upstreams stopped halfway), whose
throughput and proxy overhead p50/p99 it records in ``benchmark.extra_info``.

Run: ``pytest benchmarks/test_routing_bench.py --benchmark-enable -s``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from canopy.apps.routing import Outcomes, replay

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _outcomes(n: int = 20_000, k: int = 4, regions: int = 50, seed: int = 0) -> Outcomes:
    rng = np.random.default_rng(seed)
    p = rng.random((regions, k))
    region = rng.integers(regions, size=n)
    quality = (rng.random((n, k)) < p[region]).astype(float)
    cost = np.tile(np.geomspace(0.001, 0.1, k), (n, 1))
    return Outcomes("bench", tuple(f"q{i}" for i in range(n)),
                    tuple(f"g{r % 5}/r{r}" for r in region), tuple(f"m{j}" for j in range(k)),
                    quality, cost)


def test_replay_speed(benchmark):
    """Regional + flat learners, 20k queries x 4 models x 5 lambdas x 2 seeds."""
    outcomes = _outcomes()
    replay(outcomes, seeds=1, lambdas=[0.0], routers=["regional"])  # compile
    result = benchmark(replay, outcomes, seeds=2, lambdas=[0, 1, 3, 10, 30],
                       routers=["regional", "flat"])
    steps = 2 * 5 * 2 * outcomes.n_queries
    benchmark.extra_info["learner_steps"] = steps
    assert result.quality.shape == (2, 5, 2)


@pytest.mark.live
def test_proxy_load_1000(benchmark, tmp_path, monkeypatch):
    from llm_server import _require_llama

    _require_llama()
    from canopy.apps.routing.proxy.app import create_app, serve_in_thread
    from canopy.apps.routing.proxy.config import ProxyConfig
    from canopy.apps.routing.proxy.loadtest import run_load_test
    from canopy.llm.local import LocalLlamaServer

    prices = {"version": "bench-1", "models": {"small": {"input": 1.0, "output": 1.0},
                                               "large": {"input": 50.0, "output": 50.0}}}
    with LocalLlamaServer(n_threads=1) as small, LocalLlamaServer(n_threads=1) as large:
        config = ProxyConfig.from_mapping({"upstreams": [
            {"model": "small", "base_url": small.base_url, "upstream_model": small.model,
             "timeout_s": 300},
            {"model": "large", "base_url": large.base_url, "upstream_model": large.model,
             "timeout_s": 300}],
            "state_path": str(tmp_path / "router.sqlite"), "lam": 1000.0, "prices": prices,
            "deadline_s": 360, "auth": {"admin_key_env": "BENCH_ADMIN_KEY"}})
        monkeypatch.setenv("BENCH_ADMIN_KEY", "bench-admin-key")
        with serve_in_thread(create_app(config)) as url:
            result = benchmark.pedantic(
                run_load_test, args=(url,),
                kwargs={"requests": 1000, "concurrency": 32, "max_tokens": 1,
                        "regions": ["chat", "code/python", "math"],
                        "quality": lambda answer: 1.0, "halfway": small.stop,
                        "request_timeout": 400.0, "api_key": "bench-admin-key"},
                rounds=1, iterations=1)
    summary = result.summary()
    benchmark.extra_info.update(summary)
    print(json.dumps(summary, indent=1))
    assert result.client_errors == [] and result.status == {200: 1000}


def test_proxy_overhead_scripted(benchmark, tmp_path, monkeypatch):
    """The proxy's own time per request (``X-Canopy-Overhead-Ms``: routing, region, pricing,
    recording; the upstream's time left out) and the client's round trip, over 400 chats
    and 100 streams, one at a time, against two scripted upstreams on loopback, each chat
    rated. Medians and p99 in ``benchmark.extra_info``."""
    pytest.importorskip("fastapi")
    import time

    import httpx

    from canopy.apps.routing.proxy.app import create_app, serve_in_thread
    from canopy.apps.routing.proxy.config import ProxyConfig
    from llm_server import ScriptedServer

    events = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}
                                    ).encode() + b"\n\ndata: [DONE]\n\n"
    chat = ScriptedServer.chat_body("hi", prompt_tokens=10, completion_tokens=2)
    servers = [ScriptedServer().start(), ScriptedServer().start()]
    for server in servers:  # events when the body asks for a stream
        server.routes["/v1/chat/completions"] = lambda _, s=server: (
            200, events if s.bodies[-1].get("stream") else chat, 0.0)
    monkeypatch.setenv("BENCH_ADMIN_KEY", "bench-admin-key")
    prices = {"version": "bench-1", "models": {"small": {"input": 1.0, "output": 1.0},
                                               "large": {"input": 50.0, "output": 50.0}}}
    config = ProxyConfig.from_mapping({"upstreams": [
        {"model": "small", "base_url": servers[0].url("/v1")},
        {"model": "large", "base_url": servers[1].url("/v1")}],
        "store": f"sqlite:///{tmp_path / 'router.sqlite'}", "lam": 10.0, "prices": prices,
        "auth": {"admin_key_env": "BENCH_ADMIN_KEY"}})
    ask = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2}
    overhead, total = [], []

    def run(client: httpx.Client) -> None:
        for n in range(400):
            t0 = time.perf_counter()
            answer = client.post("/v1/chat/completions", json=ask,
                                 headers={"X-Canopy-Region": f"r{n % 8}"})
            total.append((time.perf_counter() - t0) * 1000.0)
            overhead.append(float(answer.headers["X-Canopy-Overhead-Ms"]))
            client.post("/v1/feedback", json={"request_id": answer.json()["canopy"][
                "request_id"], "quality": 0.5})

    try:
        with serve_in_thread(create_app(config)) as url, httpx.Client(
                base_url=url, timeout=30,
                headers={"Authorization": "Bearer bench-admin-key"}) as client:
            for _ in range(20):  # warm the connections and the kernels
                client.post("/v1/chat/completions", json=ask)
            benchmark.pedantic(run, args=(client,), rounds=1, iterations=1)
            stream_ms = []
            for _ in range(100):
                t0 = time.perf_counter()
                with client.stream("POST", "/v1/chat/completions",
                                   json={**ask, "model": "small", "stream": True}) as answer:
                    b"".join(answer.iter_raw())
                stream_ms.append((time.perf_counter() - t0) * 1000.0)
    finally:
        for server in servers:
            server.close()
    summary = {"overhead_ms_p50": float(np.median(overhead)),
               "overhead_ms_p99": float(np.percentile(overhead, 99)),
               "round_trip_ms_p50": float(np.median(total)),
               "round_trip_ms_p99": float(np.percentile(total, 99)),
               "stream_round_trip_ms_p50": float(np.median(stream_ms))}
    benchmark.extra_info.update(summary)
    print(json.dumps(summary, indent=1))
    assert len(overhead) == 400


def test_gateway_overhead_beside_peers(benchmark):
    """The latency the gateway adds as its client sees it, beside sglang-router and
    vllm-router where installed (``benchmarks/gateway_overhead.py``: one interleaved run,
    loopback echo upstreams, auth on); its figures in ``benchmark.extra_info``."""
    pytest.importorskip("fastapi")
    from gateway_overhead import measure

    result = benchmark.pedantic(measure, kwargs={"rounds": 500, "warmup": 100},
                                rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    print(json.dumps(result, indent=1))
    assert result["results"]["canopy"]["added_p50_ms"] > 0


def test_region_tree_insert_100k(benchmark):
    """100,000 distinct two-level regions into a router: linear growth (issue 16.1)."""
    from canopy.regional import RegionalRouter

    paths = [f"group{i % 100}/task{i}" for i in range(100_000)]

    def grow() -> int:
        router = RegionalRouter(["a", "b"])
        for path in paths:
            router.chain(path)
        return router.regions.n_nodes

    assert benchmark.pedantic(grow, rounds=1, iterations=1) == 100_101


def test_attack_region_header_refused(benchmark):
    """The 8,000-level region header of issue 16.1, refused before any node is made."""
    from canopy.regional import RegionTree

    header = "x/" * 8000

    def refuse() -> str:
        try:
            RegionTree().add(header)
        except ValueError as error:
            return str(error)
        return ""

    assert "characters" in benchmark(refuse)


def _serve_workers(config: Path, port: int, env: dict[str, str]):
    """``canopy serve router --workers 2`` in its own process group, once healthy."""
    import os
    import subprocess
    import time

    import httpx

    process = subprocess.Popen([sys.executable, "-m", "canopy", "serve", "router", "--config",
                                str(config), "--workers", "2", "--port", str(port)],
                               env={**os.environ, **env}, start_new_session=True)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the proxy did not come up")


@pytest.mark.live
def test_proxy_two_workers_upstream_stopped_and_kill9(benchmark, tmp_path):
    """1,000 requests, 32 at a time, against ``--workers 2`` with the cheap upstream stopped
    halfway (0 lost, 0 hung); then a kill -9 of the whole proxy in the middle of a second run
    and a restart: every feedback acknowledged with 200 is in the statistics."""
    import os
    import signal
    import socket
    import threading
    import time

    import httpx

    from llm_server import _require_llama

    _require_llama()
    from canopy.apps.routing.proxy.loadtest import run_load_test
    from canopy.llm.local import LocalLlamaServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url, admin = f"http://127.0.0.1:{port}", "bench-admin-key"
    env = {"BENCH_ADMIN_KEY": admin}
    load = {"concurrency": 32, "max_tokens": 1, "regions": ["chat", "code/python", "math"],
            "quality": lambda answer: 1.0, "request_timeout": 400.0, "api_key": admin}
    with LocalLlamaServer(n_threads=1) as small, LocalLlamaServer(n_threads=1) as large:
        config = tmp_path / "router.json"
        config.write_text(json.dumps({"upstreams": [
            {"model": "small", "base_url": small.base_url, "upstream_model": small.model,
             "timeout_s": 300},
            {"model": "large", "base_url": large.base_url, "upstream_model": large.model,
             "timeout_s": 300}],
            "state_path": "router.sqlite", "lam": 1000.0, "deadline_s": 360,
            "prices": {"version": "bench-1", "models": {"small": {"input": 1.0, "output": 1.0},
                                                        "large": {"input": 50.0,
                                                                  "output": 50.0}}},
            "auth": {"admin_key_env": "BENCH_ADMIN_KEY"}}))
        proxy = _serve_workers(config, port, env)
        try:
            first = benchmark.pedantic(run_load_test, args=(url,),
                                       kwargs={"requests": 1000, "halfway": small.stop, **load},
                                       rounds=1, iterations=1)
            box: dict[str, object] = {}
            runner = threading.Thread(target=lambda: box.update(
                result=run_load_test(url, requests=400, **load)))
            runner.start()
            time.sleep(8.0)
            os.killpg(proxy.pid, signal.SIGKILL)
            proxy.wait()
            runner.join()
        finally:
            if proxy.poll() is None:
                os.killpg(proxy.pid, signal.SIGKILL)
        proxy = _serve_workers(config, port, env)
        try:
            stats = httpx.get(f"{url}/v1/router/stats",
                              headers={"Authorization": f"Bearer {admin}"}, timeout=60).json()
        finally:
            os.killpg(proxy.pid, signal.SIGKILL)
    second = box["result"]
    acknowledged = first.feedback_status.get(200, 0) + second.feedback_status.get(200, 0)
    summary = {**first.summary(), "kill9_acknowledged_feedback": acknowledged,
               "kill9_second_run_answered": second.status.get(200, 0),
               "with_feedback_after_restart": stats["with_feedback"]}
    benchmark.extra_info.update(summary)
    print(json.dumps(summary, indent=1))
    assert first.client_errors == [] and first.status == {200: 1000}
    assert stats["with_feedback"] >= acknowledged


def test_chat_with_the_store_down_vs_up(benchmark, tmp_path, monkeypatch):
    """Chat p50 through the proxy on a Redis store, up then killed (``-9``): the store's
    circuit opens and chat adds no store wait (target: the p50 with the store down within
    10% of the p50 with it up). 200 sequential chats each, against two scripted upstreams;
    the p50s and their ratio in ``benchmark.extra_info``."""
    pytest.importorskip("fastapi")
    import time

    import httpx

    from canopy.apps.routing.proxy.app import create_app, serve_in_thread
    from canopy.apps.routing.proxy.config import ProxyConfig
    from llm_server import ScriptedServer
    from redis_server import start_redis

    redis, store = start_redis(tmp_path / "redis", persist=False)
    chat = ScriptedServer.chat_body("hi", prompt_tokens=10, completion_tokens=2)
    servers = [ScriptedServer().start(), ScriptedServer().start()]
    for server in servers:
        server.routes["/v1/chat/completions"] = lambda _: (200, chat, 0.0)
    monkeypatch.setenv("BENCH_ADMIN_KEY", "bench-admin-key")
    config = ProxyConfig.from_mapping({"upstreams": [
        {"model": "small", "base_url": servers[0].url("/v1")},
        {"model": "large", "base_url": servers[1].url("/v1")}],
        "store": store, "lam": 10.0, "auth": {"admin_key_env": "BENCH_ADMIN_KEY"},
        "prices": {"version": "bench-1", "models": {"small": {"input": 1.0, "output": 1.0},
                                                    "large": {"input": 50.0, "output": 50.0}}}})
    ask = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2}
    app = create_app(config)

    def chats(client: httpx.Client, n: int = 200) -> list[float]:
        took = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert client.post("/v1/chat/completions", json=ask).status_code == 200
            took.append((time.perf_counter() - t0) * 1000.0)
        return took

    try:
        with serve_in_thread(app) as url, httpx.Client(
                base_url=url, timeout=30,
                headers={"Authorization": "Bearer bench-admin-key"}) as client:
            chats(client, 20)  # warm the connections and the kernels
            up = chats(client)
            redis.kill()
            redis.wait(timeout=30)
            while not app.state.proxy.service.store.down:
                client.post("/v1/chat/completions", json=ask)
                time.sleep(0.05)
            down = benchmark.pedantic(chats, args=(client,), rounds=1, iterations=1)
    finally:
        redis.kill()
        for server in servers:
            server.close()
    summary = {"chat_ms_p50_store_up": float(np.median(up)),
               "chat_ms_p50_store_down": float(np.median(down)),
               "down_over_up": float(np.median(down) / np.median(up))}
    benchmark.extra_info.update(summary)
    print(json.dumps(summary, indent=1))
    assert len(down) == 200
