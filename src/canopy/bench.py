"""Speed measurements behind ``canopy bench``: per-round overhead of the policies' ask/tell
surface and the certificate's throughput. Measurements, not assertions: nothing here fails on
a slow machine."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from canopy.certificate import RunningCertificate, certify
from canopy.instances import garland, tree_lipschitz_values
from canopy.policies.base import Policy
from canopy.policies.descent import max_branching
from canopy.problem import ProblemSpec
from canopy.tree import LazyTree, Tree

__all__ = ["certificate_throughput", "policy_overhead_us", "run_benchmarks"]


def policy_overhead_us(make_policy: Callable[[], Policy], tree: Tree | LazyTree, rounds: int,
                       *, seed: int = 0) -> float:
    """Microseconds per round of ``ask`` + ``tell`` through the :class:`Policy` surface (the
    one per-round benchmark: ``canopy bench``, the benchmarks and their tests use it).

    Measured in CPU time of the calling thread, so other work on a busy machine does not
    inflate it (cache contention still can). Observations are a tree-Lipschitz value of the
    played node (or the garland at the cell's midpoint on a :class:`LazyTree`) plus
    N(0, 0.1^2) noise; the cost of producing them is measured on the same node sequence and
    subtracted. A 200-round warm-up on a separate policy loads the compiled kernels first.
    Probe and leaf cost are both 1, so ``rounds`` is also the budget."""
    rng = np.random.default_rng(seed)
    noise = 0.1 * rng.standard_normal(rounds)
    if isinstance(tree, Tree):
        leaf_values = tree_lipschitz_values(tree, 1.0, rng, branching=max_branching(tree))
        table = tree.subtree_means(leaf_values)

        def value_of(node: object) -> float:
            return table[node]  # type: ignore[index]
    else:
        def value_of(node: object) -> float:
            level, index = node  # type: ignore[misc]
            return float(garland(np.array([(index + 0.5) / tree.arity**level]))[0])

    spec = ProblemSpec(tree, 0.1, 1.0, 1.0)
    warm = make_policy().start(spec, budget=200.0, seed=seed)
    while (query := warm.ask()) is not None:
        warm.tell(query, value_of(query.node))
    policy = make_policy().start(spec, budget=float(rounds), seed=seed)
    nodes: list[object] = []
    started = time.thread_time()
    for i in range(rounds):
        query = policy.ask()
        if query is None:
            break
        nodes.append(query.node)
        policy.tell(query, value_of(query.node) + noise[i])
    total = time.thread_time() - started
    if not nodes:
        raise RuntimeError(f"{type(policy).__name__} asked nothing")
    started = time.thread_time()
    for i, node in enumerate(nodes):
        _ = value_of(node) + noise[i]
    replay = time.thread_time() - started
    return 1e6 * max(total - replay, 0.0) / len(nodes)


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
