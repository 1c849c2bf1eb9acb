"""Replay speed in block references per second (targets: lru >= 2e6, canopy >= 1e6 on 2 cores;
sieve at lru's speed, >= 0.9x lru's in the same run at every capacity).

Run: ``CANOPY_DATA_DIR=... pytest benchmarks/test_cache_bench.py --benchmark-enable``; each
benchmark's ``extra_info`` holds ``block_refs_per_s`` (wall clock, median round) and
``cpu_block_refs_per_s`` (CPU time of the replaying thread, best of the rounds: on a shared
machine the wall clock also counts other jobs' time slices). Compare policies within one run
(``-k "conversation and (lru or sieve)"``): the machine's load moves every number;
``-k sieve_speed_against_lru`` alternates the two replays round by round.
"""

from __future__ import annotations

import time

import pytest

from canopy import data
from canopy.apps.cache import RadixCache, load_mooncake, make_policy

CAPACITIES = [16, 64, 256, 1024, 4096]


def _trace(name: str):
    try:
        return load_mooncake(data.path("mooncake", f"{name}_trace.jsonl", download=False))
    except data.DataNotFound as missing:
        pytest.skip(str(missing))


def _replay_speed(benchmark, trace, policy: str, capacity: int) -> None:
    RadixCache(trace, make_policy(policy), capacity).run()  # compile / load the kernel
    cpu: list[float] = []

    def setup():
        return (RadixCache(trace, make_policy(policy), capacity),), {}

    def replay(cache):
        began = time.thread_time()
        cache.run()
        cpu.append(time.thread_time() - began)

    benchmark.pedantic(replay, setup=setup, rounds=5)
    benchmark.extra_info["block_refs_per_s"] = trace.n_refs / benchmark.stats.stats.median
    benchmark.extra_info["cpu_block_refs_per_s"] = trace.n_refs / max(min(cpu), 1e-9)
    assert len(cpu) == 5


# capacity outermost: at each capacity the policies run one after another, close in time
@pytest.mark.parametrize("policy", ["lru", "lfu", "sieve", "canopy", "optimal"])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_replay_speed_conversation(benchmark, policy, capacity):
    _replay_speed(benchmark, _trace("conversation"), policy, capacity)


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("trace", ["conversation", "synthetic"])
def test_sieve_speed_against_lru(benchmark, trace, capacity):
    """SIEVE's replay and LRU's, one after the other in every round (a loaded machine slows
    both alike): ``extra_info`` holds each one's block references per CPU second (best
    round) and ``sieve_over_lru``, their ratio."""
    trace = _trace(trace)
    for policy in ("lru", "sieve"):
        RadixCache(trace, make_policy(policy), capacity).run()  # compile / load the kernels
    cpu: dict[str, list[float]] = {"lru": [], "sieve": []}

    def timed(policy: str, cache: RadixCache) -> None:
        began = time.thread_time()
        cache.run()
        cpu[policy].append(time.thread_time() - began)

    def setup():
        timed("lru", RadixCache(trace, make_policy("lru"), capacity))
        return (RadixCache(trace, make_policy("sieve"), capacity),), {}

    benchmark.pedantic(lambda cache: timed("sieve", cache), setup=setup, rounds=15)
    best = {policy: trace.n_refs / max(min(times), 1e-9) for policy, times in cpu.items()}
    benchmark.extra_info.update({f"{policy}_cpu_block_refs_per_s": rate
                                 for policy, rate in best.items()})
    benchmark.extra_info["sieve_over_lru"] = best["sieve"] / best["lru"]
    assert len(cpu["lru"]) == len(cpu["sieve"]) == 15
