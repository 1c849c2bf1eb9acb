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
