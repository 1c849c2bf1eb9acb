"""Replica index and policies at scale (targets: 64 replicas, 10^6 indexed blocks each held by
two replicas on average: decision p50 <= 20 us and index memory <= 64 bytes per indexed
block; the simulator >= 50,000 requests a second at 8 replicas). Decisions are timed through
the gateway's path, :meth:`canopy.fleet.ReplicaPolicy.choose`, for ``canopy`` (learning,
precise index), ``sglang`` (approximate) and ``least_load`` side by side.

Run: ``CANOPY_DATA_DIR=... pytest benchmarks/test_fleet_bench.py --benchmark-enable``; the
figures are in each benchmark's ``extra_info`` (``decision_us_p50``, ``bytes_per_block``,
``requests_per_s``).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from canopy import data
from canopy.fleet import Load, ReplicaIndex, Request, View, make_policy

REPLICAS = 64
BLOCKS = 1_000_000
CHAIN = 32  # blocks a request
DECISIONS = 2_000


def _index(mode: str) -> tuple[ReplicaIndex, np.ndarray]:
    """10^6 blocks in chains of 32, each chain held by two replicas (or sent to two)."""
    rng = np.random.default_rng(0)
    index = ReplicaIndex(REPLICAS, mode=mode, capacity=1024)
    chains = rng.integers(1, 2 ** 62, size=(BLOCKS // CHAIN, CHAIN), dtype=np.int64)
    for chain in chains:
        a, b = rng.choice(REPLICAS, size=2, replace=False)
        if mode == "precise":
            index.stored(int(a), chain)
            index.stored(int(b), chain)
        else:
            index.sent(int(a), chain, 0.0)
            index.sent(int(b), chain, 0.0)
    return index, chains


@pytest.fixture(scope="module")
def precise():
    return _index("precise")


@pytest.fixture(scope="module")
def approximate():
    return _index("approximate")


def _decisions(benchmark, index: ReplicaIndex, chains: np.ndarray, name: str) -> None:
    rng = np.random.default_rng(1)
    policy = make_policy(name, seed=0)
    load = Load(REPLICAS, capacity_blocks=BLOCKS)
    load.table[:3] = rng.integers(0, 8, size=(3, REPLICAS))
    view = View(index, load, 0.0, 16)
    rows = rng.integers(0, chains.shape[0], size=DECISIONS)
    cut = rng.integers(8, CHAIN + 1, size=DECISIONS)  # a hit of part of a chain, then new blocks
    requests = [Request(np.concatenate([chains[r, :c], rng.integers(1, 2 ** 62, size=4)]),
                        (int(c) + 4) * 16, rid=i)
                for i, (r, c) in enumerate(zip(rows, cut, strict=True))]
    for request in requests[:10]:  # compile
        policy.choose(request, view)
    times = np.empty(DECISIONS)

    def run():
        for i, request in enumerate(requests):
            start = time.perf_counter_ns()
            replica = policy.choose(request, view)
            times[i] = (time.perf_counter_ns() - start) / 1e3
            policy.observe(request, replica, 0.5)

    benchmark.pedantic(run, rounds=3)
    benchmark.extra_info["decision_us_p50"] = float(np.median(times))
    benchmark.extra_info["decision_us_p99"] = float(np.percentile(times, 99))
    benchmark.extra_info["bytes_per_block"] = index.nbytes / index.n_blocks
    benchmark.extra_info["indexed_blocks"] = index.n_blocks


@pytest.mark.parametrize("name", ["canopy", "dynamo", "least_load"])
def test_decision_precise(benchmark, precise, name):
    _decisions(benchmark, *precise, name)


@pytest.mark.parametrize("name", ["sglang", "least_load"])
def test_decision_approximate(benchmark, approximate, name):
    _decisions(benchmark, *approximate, name)


def test_index_events(benchmark):
    """Index upkeep: a chain of 32 stored then removed (one BlockStored, one BlockRemoved)."""
    index, _ = _index("precise")
    rng = np.random.default_rng(2)
    batch = rng.integers(1, 2 ** 62, size=(1000, CHAIN), dtype=np.int64)

    def run():
        for chain in batch:
            index.stored(5, chain)
        for chain in batch:
            index.removed(5, chain)

    benchmark.pedantic(run, rounds=3)
    benchmark.extra_info["events_per_s"] = 2 * len(batch) / benchmark.stats.stats.median


@pytest.mark.parametrize("name", ["canopy", "least_load"])
def test_simulator_speed(benchmark, name):
    """Requests replayed a second, 8 replicas, the conversation trace at load 0.9."""
    from canopy.apps.fleet.sim import Spec, load_trace, simulate

    try:
        trace = load_trace("conversation")
    except data.DataNotFound as missing:
        pytest.skip(str(missing))
    spec = Spec(name, "precise")
    capacity = trace.working_set // 8

    def run():
        return simulate(trace, spec, n_replicas=8, capacity=capacity, load=0.9, seed=0,
                        time_decisions=False)

    run()  # compile
    seconds = []
    benchmark.pedantic(lambda: seconds.append(run().seconds), rounds=5)
    benchmark.extra_info["requests_per_s"] = trace.trace.n_requests / float(np.median(seconds))
    benchmark.extra_info["requests_per_s_with_setup"] = (trace.trace.n_requests /
                                                         benchmark.stats.stats.median)
