"""The fleet simulator: a Mooncake-format trace replayed through N simulated replicas under
each replica policy, at several loads and seeds (the compiled loop: :mod:`.kernel`).

``load`` is the prefill work of every prompt token, as if nothing were cached, over the
fleet's capacity (N replicas' worth, or ``cores`` where the replicas share fewer): the
trace's timestamps are scaled so that ``sum(prefill time of every whole
prompt) / (N x span) = load``. Each seed jitters the arrival times (an exponential delay of
half the mean gap, so neighbours may swap) and seeds the policies' own random choices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from canopy import data
from canopy.data import jsonl_rows
from canopy.fleet import policies as pol
from canopy.fleet.index import ReplicaIndex
from canopy.fleet.load import Load
from canopy.prefix.traces import TRACE_FILES, Trace, load_mooncake
from canopy.stats import mean_ci
from canopy.validation import check_count, check_number, check_positive

__all__ = ["ENGINES", "FleetTrace", "Run", "Spec", "best_fixed", "load_trace", "simulate", "specs",
           "summarize", "sweep"]

DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens of a request whose trace line has no ``output_length``."""
TIMED_DECISIONS = 256
"""Requests whose decision is timed through the gateway's path
(:meth:`~canopy.fleet.policies.ReplicaPolicy.choose`)."""


@dataclass(frozen=True)
class FleetTrace:
    """A trace (:class:`~canopy.prefix.traces.Trace`) with its output lengths."""

    trace: Trace
    output_tokens: np.ndarray

    @property
    def name(self) -> str:
        return self.trace.name

    @property
    def working_set(self) -> int:
        """Distinct blocks of the trace."""
        return self.trace.n_nodes

    @property
    def longest(self) -> int:
        """Blocks of the longest request."""
        return int(np.diff(self.trace.offsets).max())

    def head(self, n: int) -> FleetTrace:
        return FleetTrace(self.trace.head(n), self.output_tokens[:n])


def load_trace(name_or_path: str | Path) -> FleetTrace:
    """A mirrored Mooncake trace by name (``conversation``, ``synthetic``, ``toolagent``) or
    a Mooncake-format JSONL file (``timestamp``, ``input_length``, ``hash_ids``, optional
    ``output_length``); a malformed line raises :class:`ValueError` naming it."""
    key = str(name_or_path)
    if key in TRACE_FILES:
        file, name = data.path("mooncake", TRACE_FILES[key]), key
    else:
        file, name = Path(key), None
        if not file.is_file():
            raise ValueError(f"trace must be one of {', '.join(TRACE_FILES)} or an existing "
                             f"Mooncake JSONL file, got {key!r}")
    trace = load_mooncake(file, name=name)
    outputs = np.array([int(row.get("output_length", DEFAULT_OUTPUT_TOKENS))
                        if isinstance(row, dict) else DEFAULT_OUTPUT_TOKENS
                        for _, row in jsonl_rows(file, objects=False, what="trace")],
                       dtype=np.int64)
    return FleetTrace(trace, outputs)


@dataclass(frozen=True)
class Spec:
    """One row's policy: a name, the index it routes on, and its keyword arguments for
    :func:`canopy.fleet.policies.make_policy` (``"oracle"``: the reference)."""

    policy: str
    index: str
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.policy if "theta" not in self.options else \
            f"{self.policy}(theta={self.options['theta']:g})"


def specs(names: Sequence[str]) -> list[Spec]:
    """The rows of ``--policies``: each peer on its production index, ``canopy`` on each
    index (two rows); unknown names raise :class:`ValueError`."""
    out = []
    for name in names:
        if name not in pol.NAMES:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(pol.NAMES)}")
        if name == "canopy":
            out += [Spec("canopy", "precise"), Spec("canopy", "approximate")]
        else:
            out.append(Spec(name, pol.PRODUCTION_INDEX.get(name, "none")))
    return out


@dataclass
class Run:
    """One replay: per request its TTFT (s), blocks hit, replica and trade-off."""

    spec: Spec
    load: float
    seed: int
    ttft: np.ndarray
    hits: np.ndarray
    replica: np.ndarray
    theta: np.ndarray
    busy: np.ndarray
    hit_rate: float
    decision_us_p50: float
    seconds: float


def arrivals(trace: FleetTrace, *, n_replicas: float, load: float, ms_per_token: float,
             overhead_ms: float, seed: int) -> np.ndarray:
    """Arrival times (s) scaled to ``load`` of ``n_replicas`` replicas' worth of compute and
    jittered by ``seed`` (sorted)."""
    t = trace.trace
    work_s = (overhead_ms * t.n_requests + ms_per_token * float(t.input_tokens.sum())) / 1e3
    span_s = work_s / (n_replicas * load)
    stamps = t.timestamps - t.timestamps[0]
    scale = span_s / stamps[-1] if stamps[-1] > 0 else 0.0
    times = stamps * scale if scale > 0 else np.linspace(0.0, span_s, t.n_requests)
    gap = span_s / max(t.n_requests, 1)
    rng = np.random.default_rng(seed)
    return np.sort(times + rng.exponential(0.5 * gap, t.n_requests), kind="stable")


def _policy(spec: Spec, *, seed: int, overhead_tokens: float) -> pol.ReplicaPolicy | None:
    if spec.policy == "oracle":
        return None
    options = dict(spec.options)
    if spec.policy == "canopy":
        options.setdefault("overhead_tokens", overhead_tokens)
    return pol.make_policy(spec.policy, seed=seed, **options)


def _regions(router: pol.TradeoffRouter, trace: Trace) -> np.ndarray:
    """Each request's region node in a learning policy's router (regions created up front)."""
    offsets, nodes = trace.offsets, trace.nodes
    lengths = np.diff(offsets)
    first = nodes[offsets[:-1]]
    deep = nodes[offsets[:-1] + np.minimum(lengths, pol.REGION_DEPTH) - 1]
    out = np.empty(trace.n_requests, dtype=np.int64)
    known: dict[tuple[int, int], int] = {}
    for i, (a, b) in enumerate(zip(first.tolist(), deep.tolist(), strict=True)):
        pair = pol.region_buckets(a, b)
        node = known.get(pair)
        if node is None:
            node = known[pair] = router.node(f"{pair[0]}/{pair[1]}")
        out[i] = node
    return out


def _time_decisions(policy: pol.ReplicaPolicy, spec: Spec, trace: FleetTrace,
                    replica: np.ndarray, n_replicas: int, capacity: int,
                    block_tokens: int) -> float:
    """Median microseconds of :meth:`ReplicaPolicy.choose` (the gateway's path) on the last
    requests of the run, with an index holding what the run's replicas last received."""
    t = trace.trace
    n = min(TIMED_DECISIONS, t.n_requests)
    index = ReplicaIndex(n_replicas, mode=spec.index if spec.index != "none" else "precise")
    load = Load(n_replicas, capacity_blocks=capacity)
    lo = t.n_requests - n
    for i in range(max(0, lo - 4 * n), t.n_requests):
        keys = t.path(i)
        if index.mode == "approximate":
            index.sent(int(replica[i]), keys, 0.0)
        else:
            index.stored(int(replica[i]), keys)
    view = pol.View(index, load, 0.0, block_tokens)
    times = np.empty(n)
    for j, i in enumerate(range(lo, t.n_requests)):
        request = pol.Request(t.path(i), int(t.input_tokens[i]), rid=i)
        start = time.perf_counter_ns()
        policy.choose(request, view)
        times[j] = (time.perf_counter_ns() - start) / 1e3
    return float(np.median(times))


EVICTIONS = ("lru", "canopy")
ENGINES = ("serial", "batched")
"""How a replica prefills (:mod:`.kernel`): ``serial``, one request at a time in arrival
order (llama.cpp's server, one slot); ``batched``, in steps that prefill together every
request that waited (vLLM's continuous batching)."""


def _replicas(trace: Trace, n_replicas: int, capacity: int, eviction: str) -> tuple:
    """``(serve, held, state, events)`` of the replicas' caches for the compiled replay."""
    from canopy.apps.fleet import kernel

    if eviction == "lru":
        return kernel.serve_lru, kernel.held_lru, kernel.lru_state(n_replicas,
                                                                   trace.n_nodes), True
    if eviction != "canopy":
        raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
    from canopy.prefix import BlockTree, make_policy

    caches = [BlockTree(make_policy("canopy"), capacity, trace=trace).kernel_args()
              for _ in range(n_replicas)]
    state = (trace.nodes, trace.parent, trace.depth, caches[0][0],
             tuple(c[1] for c in caches), tuple(c[2] for c in caches),
             tuple(c[3] for c in caches))
    return kernel.serve_canopy, kernel.held_canopy, state, False


def simulate(trace: FleetTrace, spec: Spec, *, n_replicas: int, capacity: int, load: float,
             seed: int, ms_per_token: float = 0.1, overhead_ms: float = 20.0,
             tpot_ms: float = 20.0, eviction: str = "lru", time_decisions: bool = True,
             engine: str = "serial", cores: float | None = None) -> Run:
    """One replay of ``trace`` under ``spec``, the replicas evicting by ``eviction`` and
    prefilling as ``engine`` does (:data:`ENGINES`); with ``cores`` the replicas share that
    many replicas' worth of compute (``None``: each its own)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if cores is not None:
        check_positive(cores, "cores")
    from canopy.apps.fleet.kernel import ORACLE, replay

    t = trace.trace
    # a queued request costs a serial replica its overhead; a batched one pays the overhead
    # once a step, for the whole batch: there a queued request costs its tokens only
    policy = _policy(spec, seed=seed, overhead_tokens=0.0 if engine == "batched" else
                     overhead_ms / max(ms_per_token, 1e-12))
    arrival = arrivals(trace, n_replicas=n_replicas if cores is None else
                       min(n_replicas, cores), load=load, ms_per_token=ms_per_token,
                       overhead_ms=overhead_ms, seed=seed)
    n = t.n_requests
    ttft, hits = np.zeros(n), np.zeros(n, dtype=np.int64)
    replica, theta = np.zeros(n, dtype=np.int64), np.zeros(n)
    busy = np.zeros(n_replicas)
    grid = np.zeros(1)
    stats = np.zeros((1, 1, 3))
    chains = np.full((1, 1), -1, dtype=np.int64)
    region_of = np.zeros(n, dtype=np.int64)
    rule, cost_max = np.zeros(4), np.zeros(1)
    router = None if policy is None else policy.router  # None unless the policy learns
    learning = router is not None
    if router is not None:
        region_of = _regions(router, t)
        stats, chains, rule, cost_max = router.tables()
        grid = router.grid
    code = ORACLE if policy is None else policy.code
    params = np.zeros(4) if policy is None else policy.params
    state = np.zeros(2, dtype=np.int64) if policy is None else policy.state
    serve, held, replicas, events = _replicas(t, n_replicas, capacity, eviction)
    start = time.perf_counter()
    replay(serve, held, replicas, events, t.offsets, t.nodes, t.n_nodes, t.input_tokens,
           trace.output_tokens, arrival,
           t.block_size, n_replicas, capacity, ms_per_token, overhead_ms, tpot_ms, code,
           params, state, spec.index == "approximate", 180.0, True, learning, stats, chains,
           region_of, rule, cost_max, grid, 1.0 if router is None else router.explore,
           n if engine == "batched" else 0 if cores is None else 1,
           math.inf if cores is None else float(cores),
           ttft, hits, replica, theta, busy)
    seconds = time.perf_counter() - start
    if router is not None:
        router.settle()
    blocks = np.diff(t.offsets)
    decision = math.nan
    if time_decisions and policy is not None:
        decision = _time_decisions(policy, spec, trace, replica, n_replicas, capacity,
                                   t.block_size)
    return Run(spec, load, seed, ttft, hits, replica, theta, busy,
               float(hits.sum() / max(blocks.sum(), 1)), decision, seconds)


def _interval(values: Sequence[float]) -> dict[str, float]:
    mean, half = mean_ci(np.asarray(values, dtype=float))
    return {"mean": float(mean), "lo": float(mean - half), "hi": float(mean + half)}


def summarize(runs: Sequence[Run], *, policy: str | None = None, index: str | None = None
              ) -> dict:
    """One ``--json`` row from the seeds of one (policy, index, load) cell."""
    first = runs[0]
    row = {"policy": policy or first.spec.policy, "index": index or first.spec.index,
           "load": first.load}
    for q in (50, 90, 99):
        row[f"ttft_p{q}_s"] = _interval([float(np.percentile(r.ttft, q)) for r in runs])
    row["hit_rate"] = float(np.mean([r.hit_rate for r in runs]))
    row["load_cv"] = float(np.mean([r.busy.std() / r.busy.mean() if r.busy.mean() > 0
                                    else 0.0 for r in runs]))
    times = [r.decision_us_p50 for r in runs if math.isfinite(r.decision_us_p50)]
    row["decision_us_p50"] = float(np.median(times)) if times else None
    if "theta" in first.spec.options:
        row["theta"] = first.spec.options["theta"]
    return row


def best_fixed(cells: dict[float, list[list[Run]]]) -> list[dict]:
    """Per load, the fixed trade-off whose mean p90 TTFT is lowest (chosen in hindsight)."""
    rows = []
    for _, candidates in cells.items():
        best = min(candidates, key=lambda runs: np.mean([np.percentile(r.ttft, 90)
                                                         for r in runs]))
        rows.append(summarize(best, policy="best_fixed", index="precise"))
    return rows


def sweep(trace: FleetTrace, *, n_replicas: int, capacity: int, loads: Sequence[float],
          names: Sequence[str], seeds: int, ms_per_token: float = 0.1,
          overhead_ms: float = 20.0, tpot_ms: float = 20.0,
          grid: Sequence[float] = pol.DEFAULT_GRID, reference: bool = True,
          every_fixed: bool = False, eviction: str = "lru", engine: str = "serial",
          cores: float | None = None, progress: Callable[[int, int], None] | None = None
          ) -> tuple[list[dict], dict[tuple[str, str, float], list[Run]]]:
    """Every (policy row, load, seed) replay, summarized: ``--json``'s ``results`` rows and
    the runs behind them. With ``reference``, ``best_fixed`` (Canopy's score at each
    ``theta`` of ``grid``, the best per load in hindsight) and ``oracle``; with
    ``every_fixed``, also a ``fixed`` row per ``theta`` (the trade-off curve). ``engine``
    and ``cores``: the replicas' prefill (:func:`simulate`)."""
    check_count(n_replicas, "n_replicas")
    check_count(seeds, "seeds")
    check_count(capacity, "capacity")
    if n_replicas > 64:
        raise ValueError(f"replicas must be <= 64, got {n_replicas}")
    if capacity < trace.longest:
        raise ValueError(f"capacity {capacity} blocks cannot hold one request: the longest "
                         f"has {trace.longest} blocks")
    for value in loads:
        check_number(value, "load", low=0.0, low_open=True)
    check_positive(ms_per_token, "ms_per_token")
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
    rows_of = specs(names)
    fixed = [Spec("canopy", "precise", {"theta": float(t)}) for t in grid] if reference \
        else []
    extra = [Spec("oracle", "precise")] if reference else []
    plan = [(s, load, seed) for load in loads for s in rows_of + fixed + extra
            for seed in range(seeds)]
    runs: dict[tuple[str, str, float], list[Run]] = {}
    for done, (spec, load, seed) in enumerate(plan, 1):
        run = simulate(trace, spec, n_replicas=n_replicas, capacity=capacity, load=load,
                       seed=seed, ms_per_token=ms_per_token, overhead_ms=overhead_ms,
                       tpot_ms=tpot_ms, eviction=eviction, time_decisions=seed == 0,
                       engine=engine, cores=cores)
        runs.setdefault((spec.label, spec.index, load), []).append(run)
        if progress is not None:
            progress(done, len(plan))
    rows = []
    for load in loads:
        rows += [summarize(runs[(s.label, s.index, load)]) for s in rows_of]
        if reference:
            rows += best_fixed({load: [runs[(s.label, s.index, load)] for s in fixed]})
            if every_fixed:
                rows += [summarize(runs[(s.label, s.index, load)], policy="fixed")
                         for s in fixed]
            rows.append(summarize(runs[("oracle", "precise", load)]))
    return rows, runs
