"""Replays and scenarios: stationary, popularity shift (with a recovery curve), capacity sweep.

Metrics (paper Section 4, "Serving systems", and Appendix E): blocks reused per request
(prefix-constrained: reuse stops at the first miss), hit ratio (reused over referenced blocks),
time-to-first-token saved (:class:`~canopy.prefix.ttft.TTFTModel`), and replay speed in
block references per second of the replaying thread's CPU time (``block_refs_per_s``; on a
shared machine the wall clock also counts other jobs' time slices) and of wall-clock time
(``wall_block_refs_per_s``). In the shift scenario only requests after the shift count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from canopy.prefix import RadixCache
from canopy.prefix.policies import EvictionPolicy, make_policy
from canopy.prefix.traces import Trace, from_paths, shifted
from canopy.prefix.ttft import TTFTModel

__all__ = ["SCENARIOS", "ReplayResult", "recovery_curve", "replay", "result", "scenario",
           "sweep"]

SCENARIOS = ("stationary", "shift")


@dataclass(frozen=True)
class ReplayResult:
    """One replay: ``reused[i]`` blocks for each counted request (those after ``start``)."""

    trace: str
    policy: str
    capacity: int
    start: int
    reused: np.ndarray = field(repr=False)
    blocks_reused_per_request: float
    hit_ratio: float
    ttft_saved_ms: float
    block_refs_per_s: float
    wall_block_refs_per_s: float

    def metrics(self) -> dict[str, float]:
        """The headline numbers, for JSON."""
        return {"blocks_reused_per_request": self.blocks_reused_per_request,
                "hit_ratio": self.hit_ratio, "ttft_saved_ms": self.ttft_saved_ms,
                "block_refs_per_s": self.block_refs_per_s,
                "wall_block_refs_per_s": self.wall_block_refs_per_s}


def replay(trace: Trace, policy: EvictionPolicy | str, capacity: int, *, start: int = 0,
           ttft: TTFTModel | None = None) -> ReplayResult:
    """Replay every request of ``trace``; metrics count requests from ``start`` on."""
    policy = make_policy(policy) if isinstance(policy, str) else policy
    if not 0 <= start < trace.n_requests:
        raise ValueError(f"start must be in 0..{trace.n_requests - 1}, got {start}")
    cache = RadixCache(trace, policy, capacity)
    began, began_cpu = time.perf_counter(), time.thread_time()
    reused_all = cache.run()
    return result(trace, policy.name, capacity, reused_all, start=start, ttft=ttft,
                  cpu_s=time.thread_time() - began_cpu, wall_s=time.perf_counter() - began)


def result(trace: Trace, policy: str, capacity: int, reused_all: np.ndarray, *,
           start: int = 0, ttft: TTFTModel | None = None, cpu_s: float = 0.0,
           wall_s: float = 0.0) -> ReplayResult:
    """The metrics of a replay of ``trace`` that reused ``reused_all[i]`` blocks on request
    ``i`` (by any cache: this one, an engine's), counting requests from ``start`` on."""
    reused = reused_all[start:].copy()
    lengths = np.diff(trace.offsets)[start:]
    cached_tokens = np.minimum(reused * trace.block_size, trace.input_tokens[start:])
    model = TTFTModel() if ttft is None else ttft
    return ReplayResult(
        trace=trace.name, policy=policy, capacity=int(capacity), start=start,
        reused=reused, blocks_reused_per_request=float(reused.mean()),
        hit_ratio=float(reused.sum() / max(lengths.sum(), 1)),
        ttft_saved_ms=float(model.saved_ms(cached_tokens).mean()),
        block_refs_per_s=trace.n_refs / max(cpu_s, 1e-9),
        wall_block_refs_per_s=trace.n_refs / max(wall_s, 1e-9))


def scenario(trace: Trace, name: str, *, before: Trace | None = None) -> tuple[Trace, int]:
    """The trace to replay and the first counted request: ``stationary`` is the trace itself;
    ``shift`` replays ``before`` (default: the same requests) in a disjoint block space first,
    so popularity learnt before the shift is worthless after it."""
    if name == "stationary":
        return trace, 0
    if name == "shift":
        return shifted(trace if before is None else before, trace)
    raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {name!r}")


def recovery_curve(result: ReplayResult, *, window: int = 500) -> np.ndarray:
    """Blocks reused per request in consecutive windows of ``window`` counted requests."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    n = len(result.reused) // window * window
    if n == 0:
        return np.array([result.blocks_reused_per_request])
    return result.reused[:n].reshape(-1, window).mean(axis=1)


def _warm_kernels(policies: Sequence[EvictionPolicy]) -> None:
    """Compile (or load) the kernels before timing, so speed excludes compilation."""
    tiny = from_paths([[1, 2], [1, 3], [1, 2, 4]], name="warm")
    for policy in policies:
        RadixCache(tiny, policy, 2).run()


def sweep(trace: Trace, *, policies: Sequence[EvictionPolicy | str],
          capacities: Sequence[int], scenario_name: str = "stationary",
          before: Trace | None = None, ttft: TTFTModel | None = None,
          progress: Callable[[ReplayResult], None] | None = None) -> list[ReplayResult]:
    """Every policy at every capacity on one scenario of ``trace``."""
    objs = [make_policy(p) if isinstance(p, str) else p for p in policies]
    if not objs or not capacities:
        raise ValueError("need at least one policy and one capacity")
    joined, start = scenario(trace, scenario_name, before=before)
    _warm_kernels(objs)
    results = []
    for capacity in capacities:
        for policy in objs:
            result = replay(joined, policy, capacity, start=start, ttft=ttft)
            results.append(result)
            if progress is not None:
                progress(result)
    return results
