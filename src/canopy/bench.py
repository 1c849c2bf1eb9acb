"""Speed measurements behind ``canopy bench``: per-round overhead of the policies' ask/tell
surface and the certificate's throughput. Measurements, not assertions: nothing here fails on
a slow machine."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from canopy.certificate import RunningCertificate, certify
from canopy.policies.base import Policy
from canopy.problem import ProblemSpec
from canopy.tree import Tree

__all__ = ["certificate_throughput", "policy_overhead_us", "run_benchmarks"]


def policy_overhead_us(make_policy: Callable[[], Policy], tree: Tree, rounds: int, *,
                       seed: int = 0) -> float:
    """Mean microseconds of CPU time per round of ``ask`` and ``tell`` over ``rounds`` rounds.

    Observations come from a tree-Lipschitz-like oracle whose leaf draws and noise are
    precomputed, so the loop is the policy's own work plus two array look-ups a round (an
    upper bound on the policy's overhead). The calling thread's CPU time is measured, not wall
    time, so other processes on a busy machine do not count. Probe and leaf cost are both 1,
    so ``rounds`` is also the budget. A short untimed warm-up run first compiles whatever the
    policy compiles.
    """
    if rounds > 200:
        policy_overhead_us(make_policy, tree, 200, seed=seed + 1)
    rng = np.random.default_rng(seed)
    leaf_value = np.cumsum(rng.normal(0.0, 1.0, tree.n_leaves)) / np.sqrt(tree.n_leaves)
    leaf_value = 0.2 + 0.6 * (leaf_value - leaf_value.min()) / max(np.ptp(leaf_value), 1e-12)
    uniforms = rng.random(rounds).tolist()
    noise = (0.1 * rng.standard_normal(rounds)).tolist()
    spec = ProblemSpec(tree, 0.1, 1.0, 1.0)
    policy = make_policy().start(spec, budget=float(rounds), seed=seed)
    lo, hi = tree.leaf_lo.tolist(), tree.leaf_hi.tolist()
    values = leaf_value.tolist()
    ask, tell = policy.ask, policy.tell
    done = 0
    start = time.thread_time_ns()
    while (query := ask()) is not None:
        node = query.node
        tell(query, values[lo[node] + int(uniforms[done] * (hi[node] - lo[node]))] + noise[done])
        done += 1
    elapsed = time.thread_time_ns() - start
    if done == 0:
        raise RuntimeError(f"{type(policy).__name__} asked nothing")
    return elapsed / done / 1e3


def certificate_throughput(n_probes: int = 1_000_000, *, seed: int = 0) -> dict[str, float]:
    """Probes per CPU second of the batch certificate, of the incremental one fed in batches of
    1,024, and of the incremental one fed one probe at a time (over 100,000 probes)."""
    rng = np.random.default_rng(seed)
    probes = rng.uniform(0, 1, n_probes) + 0.1 * rng.standard_normal(n_probes)
    certify(probes[:100], 1024, 0.1)  # compile the shared kernel outside the timing
    start = time.thread_time()
    certify(probes, 1024, 0.1)
    batch = n_probes / (time.thread_time() - start)
    running = RunningCertificate(1024, 0.1)
    start = time.thread_time()
    for chunk in np.array_split(probes, max(n_probes // 1024, 1)):
        running.update_many(chunk)
    running.certificate()
    chunked = n_probes / (time.thread_time() - start)
    single = RunningCertificate(1024, 0.1)
    single.update(0.5)
    few = probes[:100_000].tolist()
    start = time.thread_time()
    for value in few:
        single.update(value)
    single.certificate()
    one_at_a_time = len(few) / (time.thread_time() - start)
    return {"batch_probes_per_s": batch, "incremental_batched_probes_per_s": chunked,
            "incremental_single_probes_per_s": one_at_a_time}


def run_benchmarks(*, horizons: tuple[int, ...] = (10_000, 100_000),
                   progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Every figure ``canopy bench --json`` prints."""
    from canopy.policies import EdgeTargeted, OptimisticDescent, TopKBeam

    trees = {"binary_depth_10": Tree.complete(2, 10), "leaves_1048576": Tree.complete(2, 20)}
    policies: dict[str, Callable[[], Policy]] = {
        "descent": lambda: OptimisticDescent(spread="assumed", expand="refine"),
        "descent_certified": lambda: OptimisticDescent(spread="certified", expand="refine"),
        "descent_estimated": lambda: OptimisticDescent(spread="estimated", expand="refine"),
        "topk_beam": lambda: TopKBeam(),
        "edge_targeted": lambda: EdgeTargeted(),
    }
    out: dict[str, object] = {"unit": "CPU microseconds per round (ask + tell)"}
    for policy_name, make in policies.items():
        for tree_name, tree in trees.items():
            for rounds in horizons:
                key = f"{policy_name}/{tree_name}/{rounds}"
                if progress is not None:
                    progress(key)
                out[key] = policy_overhead_us(make, tree, rounds)
    if progress is not None:
        progress("certificate")
    out["certificate"] = certificate_throughput()
    return out
