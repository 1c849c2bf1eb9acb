"""Regret play (Eqs. 4-6): statistical behaviour against uniform play and fixed resolution,
the memory bound, budgets, determinism and validation."""

from __future__ import annotations

import math
import warnings
from functools import partial

import numpy as np
import pytest

from canopy.bench import policy_overhead_us
from canopy.certificate import RunningCertificate
from canopy.instances import heterogeneous_smoothness, infinite_depth, tree_lipschitz
from canopy.metrics import cumulative_regret
from canopy.policies import _explored as ex
from canopy.policies.descent import (
    KnownBiasDescent,
    MemoryBoundedDescent,
    OptimisticDescent,
)
from canopy.problem import FunctionOnInterval, LeafMeans, ProblemSpec, Query
from canopy.run import run
from canopy.tree import LazyTree, Tree

VARIANTS = {
    "assumed": dict(spread="assumed"),
    "certified": dict(spread="certified", certificate="paper"),
    "hybrid": dict(spread="hybrid"),
    "estimated": dict(spread="estimated"),
    "always": dict(expand="always"),
    "fixed": dict(expand="fixed", max_depth=2),
}


def regret_curve(policy, problem, budget, seed):
    result = run(policy, problem, budget=budget, seed=seed, record=True)
    return cumulative_regret(result, problem.value, problem.mu_star), result


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_beats_uniform_and_average_regret_falls(variant):
    n = 12_000
    finals, early, late = [], [], []
    uniform = []
    for seed in range(3):
        problem = tree_lipschitz(4, 4, seed=seed)
        curve, result = regret_curve(OptimisticDescent(**VARIANTS[variant]), problem, n, seed)
        assert result.spent <= n
        finals.append(curve[-1])
        early.append(curve[n // 8 - 1] / (n // 8))
        late.append(curve[-1] / n)
        uniform.append(n * (problem.mu_star - problem.value(0)))
    # uniform play's expected regret is n (mu* - f(root)); the descent pays well under it.
    # "always" splits a node after its first own probe, so it ends as flat UCB over the
    # leaves: it still beats uniform, by less (Eq. 6 is what keeps internal nodes informative)
    margin, fall = (0.95, 0.9) if variant == "always" else (0.6, 0.75)
    assert np.mean(finals) < margin * np.mean(uniform)
    assert np.mean(late) < fall * np.mean(early)


def test_certified_at_or_below_too_tight_assumed_lipschitz():
    n = 10_000
    tight, certified = [], []
    for seed in range(6):
        problem = heterogeneous_smoothness(4, 4, seed=seed)
        tight.append(regret_curve(OptimisticDescent(lipschitz=0.05), problem, n, seed)[0][-1])
        certified.append(regret_curve(OptimisticDescent(spread="certified", certificate="paper"),
                                      problem, n, seed)[0][-1])
    assert np.mean(certified) <= np.mean(tight)


def test_estimated_beats_too_tight_and_too_loose_assumed_lipschitz():
    n = 10_000
    finals: dict[str, list[float]] = {"tight": [], "loose": [], "estimated": []}
    for seed in range(6):
        problem = heterogeneous_smoothness(4, 4, seed=seed)
        for name, policy in (("tight", OptimisticDescent(lipschitz=0.05)),
                             ("loose", OptimisticDescent(lipschitz=3.0)),
                             ("estimated", OptimisticDescent(spread="estimated"))):
            finals[name].append(regret_curve(policy, problem, n, seed)[0][-1])
    estimated = np.mean(finals["estimated"])
    assert estimated < 0.9 * np.mean(finals["tight"])
    assert estimated < 0.9 * np.mean(finals["loose"])


def test_known_bias_descent_plays_the_given_spreads_and_beats_both_mis_specified_constants():
    n = 10_000
    finals: dict[str, list[float]] = {"tight": [], "loose": [], "known": []}
    for seed in range(6):
        problem = heterogeneous_smoothness(4, 4, seed=seed)
        bias = problem.aggregation_biases()
        known = KnownBiasDescent(bias)
        finals["known"].append(regret_curve(known, problem, n, seed)[0][-1])
        rows = np.arange(known.n_stored_)
        nodes = known._ist[rows, ex.NODE]
        assert np.array_equal(known._fs[rows, ex.SPREAD], bias[nodes])
        for name, lip in (("tight", 0.05), ("loose", 3.0)):
            finals[name].append(regret_curve(OptimisticDescent(lipschitz=lip), problem, n,
                                             seed)[0][-1])
    assert np.mean(finals["known"]) < 0.9 * np.mean(finals["tight"])
    assert np.mean(finals["known"]) < 0.9 * np.mean(finals["loose"])


def test_known_bias_descent_never_splits_a_cell_of_bias_zero_and_checks_its_input():
    tree = Tree.complete(3, 3)
    flat = LeafMeans(tree, np.full(tree.n_leaves, 0.5), sigma=0.1)
    policy = KnownBiasDescent(flat.aggregation_biases())
    run(policy, flat, budget=2_000, seed=0)
    assert policy.max_stored_ == 1  # Eq. (6) with spread 0: the root is never split
    with pytest.raises(ValueError, match="one per node"):
        KnownBiasDescent(np.array([0.1, -1.0]))
    with pytest.raises(ValueError, match="13 nodes"):
        KnownBiasDescent(np.zeros(3)).start(tree_lipschitz(3, 2, seed=0).spec, budget=10)
    assert KnownBiasDescent(np.zeros(1)).name == "descent-known-bias"


def _play(policy, problem, budget, seed):
    """Drive ``policy`` by hand; returns the played nodes and their observations."""
    rng = np.random.default_rng(seed)
    policy.start(problem.spec, budget=budget, seed=seed)
    played, values = [], []
    while (query := policy.ask()) is not None:
        value = (problem.probe(query.node, rng) if query.kind == "probe"
                 else problem.evaluate(problem.spec.leaf_of(query.node), rng))
        played.append(query.node)
        values.append(value)
        policy.tell(query, value)
    return np.array(played), np.array(values)


def test_estimated_spread_is_the_deconvolved_sd_and_tracks_local_smoothness():
    smooth, rough = [], []
    for seed in range(4):
        problem = heterogeneous_smoothness(4, 4, seed=seed)
        # c = 1 explores every level-1 cell to its own estimate within the 4,000 rounds
        policy = OptimisticDescent(spread="estimated", c=1.0)
        played, values = _play(policy, problem, 4_000, seed)
        # the root is played alone until it has its own estimate (and Eq. 6 holds), then never
        n_root = int(np.sum(played == 0))
        assert n_root >= ex.MIN_PROBES
        assert (played[:n_root] == 0).all()
        root = values[:n_root]
        within = math.sqrt(max(np.var(root, ddof=1) - problem.spec.sigma**2, 0.0))
        expected = min(1.0, within * math.sqrt(2.0 * math.log(problem.tree.n_leaves)))
        assert policy._fs[0, ex.SPREAD] == pytest.approx(expected, rel=1e-9)
        kids = int(policy._ist[0, ex.FIRST]) + np.arange(4)
        assert (policy._fs[kids, ex.COUNT] >= ex.MIN_PROBES).all()
        smooth.extend(policy._fs[kids[:2], ex.LHAT])
        rough.extend(policy._fs[kids[2:], ex.LHAT])
    # per-subtree estimates: on average the rough half's level-1 cells (L = 3 against 0.2)
    # get a much larger L_hat (a single cell's estimate is noisy at sigma = 0.1)
    assert np.mean(rough) > 2.0 * np.mean(smooth)


def test_refine_and_certified_store_fewer_nodes_than_full_resolution():
    n = 12_000
    rows = {}
    for name, kwargs in {"fixed": dict(expand="fixed", max_depth=4), "refine": {},
                         "certified": dict(spread="certified", certificate="paper")}.items():
        regrets, stored = [], []
        for seed in range(3):
            policy = OptimisticDescent(c=1.0, **kwargs)  # the memory table's c (docs/descent.md)
            regrets.append(regret_curve(policy, tree_lipschitz(4, 4, seed=seed), n, seed)[0][-1])
            stored.append(policy.max_stored_)
        rows[name] = (np.mean(regrets), np.mean(stored))
    full_regret, full_stored = rows["fixed"]
    assert full_stored == 341  # the whole tree: 1 + 4 + 16 + 64 + 256
    for name in ("refine", "certified"):
        regret, stored = rows[name]
        assert stored < full_stored / 3
        assert regret < 1.1 * full_regret


def test_composed_certified_spread_covers_every_explored_node_and_beats_uniform():
    """The composed certificate (the default ``certificate="sharp"``): at the end of a run,
    every explored node's spread is at least its true aggregation bias (delta 0.05 split over
    the tree's nodes), and the play still beats uniform."""
    n = 12_000
    finals, uniform = [], []
    for seed in range(3):
        problem = tree_lipschitz(4, 4, seed=seed)
        policy = OptimisticDescent(spread="certified")
        curve, _ = regret_curve(policy, problem, n, seed)
        finals.append(curve[-1])
        uniform.append(n * (problem.mu_star - problem.value(0)))
        tree = problem.spec.tree
        bias = tree.subtree_max(problem.means) - tree.subtree_means(problem.means)
        used = int(policy._ctl[ex.M_USED])
        rows = np.flatnonzero(policy._fs[:used, ex.COUNT] >= 2)
        assert rows.size > 20
        nodes = policy._ist[rows, ex.NODE]
        assert np.all(policy._fs[rows, ex.SPREAD] >= bias[nodes] - 1e-12)
    assert np.mean(finals) < 0.95 * np.mean(uniform)


def test_memory_bounded_on_infinite_depth():
    """The paper's rule (Eq. 6, uniform probes, forgetting any cell) under a tight cap."""
    problem = infinite_depth(3)
    n = 6_000
    policy = MemoryBoundedDescent(lipschitz=3.0, c=0.1, max_nodes=40, split="eq6")
    curve, result = regret_curve(policy, problem, n, seed=0)
    assert result.spent <= n
    assert policy.max_stored_ <= 40
    assert policy.depth_reached_ >= 5  # a complete tree of 40 nodes reaches level 3
    assert policy.tree_nodes_ == problem.tree.n_nodes_to_level(policy.depth_reached_)
    assert policy.tree_nodes_ > 5 * policy.max_stored_
    assert curve[-1] < 0.5 * n * (problem.mu_star - problem.value((0, 0)))
    cell = result.recommendation[0]
    assert problem.mu_star - problem.value(tuple(cell)) < 0.1


def test_memory_bound_forgets_the_told_row_map_with_the_cells():
    """A told node maps to its row by one lookup: the map must hold only rows that still
    hold their cell, through every forget and reuse of a tight cap."""
    problem = infinite_depth(3)
    policy = MemoryBoundedDescent(c=0.05, max_nodes=10, split="eq6").start(
        problem.spec, budget=4_000.0, seed=0)
    rng = np.random.default_rng(3)
    def cells() -> set[tuple[int, int]]:
        used = int(policy._ctl[ex.M_USED])
        return set(zip(policy._ist[:used, ex.LEVEL].tolist(),
                       policy._ist[:used, ex.NODE].tolist(), strict=True))

    forgets = 0
    while (query := policy.ask()) is not None:
        before = cells()
        policy.tell(query, problem.probe(query.node, rng))
        forgets += bool(before - cells())
        for (level, index), row in policy._row_of.items():
            assert (policy._ist[row, ex.LEVEL], policy._ist[row, ex.NODE]) == (level, index)
    assert forgets >= 10 and policy.max_stored_ <= 10


def _two_peaks(x):
    return 1.0 - 2.0 * np.minimum(np.abs(x - 0.2), np.abs(x - 0.7))


def _final_regrets(make, problem, n, seeds=range(3)):
    return [regret_curve(make(), problem, n, seed)[0][-1] for seed in seeds]


def test_the_options_resolve_from_split_and_are_stored_as_given():
    default = MemoryBoundedDescent()
    assert (default.split, default.probe, default.forget, default.radius) == (
        "variance", None, None, None)
    assert (default.probe_, default.forget_, default.radius_, default.stats_) == (
        "centre", "balanced", "moss", "path")
    paper = MemoryBoundedDescent(split="eq6")  # the paper's Eq. 1 / Eq. 4 / Eq. 6 rule
    assert (paper.probe_, paper.forget_, paper.radius_, paper.stats_) == (
        "uniform", "any", "eq4", "own")
    for spread in ("estimated", "certified"):  # their estimates rest on uniform probes
        data_driven = MemoryBoundedDescent(spread=spread)
        assert (data_driven.probe_, data_driven.forget_, data_driven.radius_,
                data_driven.stats_) == ("uniform", "any", "eq4", "own")
    mixed = MemoryBoundedDescent(split="eq6", probe="centre", forget="balanced", radius="moss")
    assert (mixed.probe_, mixed.forget_, mixed.radius_) == ("centre", "balanced", "moss")
    for kwargs, match in ((dict(split="vhct"), "split"), (dict(probe="corner"), "probe"),
                          (dict(forget="oldest"), "forget"), (dict(radius="kl"), "radius"),
                          (dict(stats="subtree"), "stats")):
        with pytest.raises(ValueError, match=match):
            MemoryBoundedDescent(**kwargs)
    with pytest.raises(ValueError, match="split"):
        OptimisticDescent(split="vhct")


@pytest.mark.parametrize("stats", ["path", "own"])
def test_a_split_cells_upper_bound_counts_its_subtrees_probes(stats):
    """``stats="path"`` (the default): a split cell's ``U`` counts every probe made in its
    subtree (each is a point of its cell, within its spread of its best point), so it keeps
    falling while its children are played; ``"own"``: the probes it had when it split."""
    problem = FunctionOnInterval(LazyTree(2), lambda x: 0.5 + 0 * x, sigma=0.1)
    policy = MemoryBoundedDescent(lipschitz=0.05, stats=stats)
    run(policy, problem, budget=2_000.0, seed=0)
    used = int(policy._ctl[ex.M_USED])
    fs, ist = policy._fs[:used], policy._ist[:used]
    split = (ist[:, ex.LEVEL] >= 0) & (ist[:, ex.FIRST] >= 0)
    assert split.sum() >= 3
    if stats == "path":
        assert np.array_equal(fs[:, ex.COUNT], fs[:, ex.SUBN])
    else:
        assert (fs[split, ex.COUNT] < fs[split, ex.SUBN]).all()
    root = fs[0]  # on every path: its U was refreshed at t = 2,000 with MOSS's radius
    radius = 0.1 * math.sqrt(2.0 * max(math.log(2_000.0 / root[ex.COUNT]), 0.0)
                             / root[ex.COUNT])
    assert root[ex.UPPER] == pytest.approx(root[ex.MEAN] + radius + 0.05, rel=1e-9)


@pytest.mark.parametrize("arity", [2, 3])
def test_centre_probes_ask_the_middle_descendant_and_carry_only_the_noise(arity):
    """A centre probe is a probe of the cell's deepest descendant holding its centre: on a
    slope its probes vary by the noise alone, a uniform probe's also by the slope."""
    problem = FunctionOnInterval(LazyTree(arity), lambda x: x, sigma=0.1)
    deepest = math.floor(62 / math.log2(arity))
    policy = MemoryBoundedDescent(probe="centre").start(problem.spec, budget=200.0, seed=0)
    level, index = policy.ask().node
    assert (level, index) == (deepest, arity**deepest // 2)
    low, high = problem.tree.interval((level, index))
    assert abs(low - 0.5) < 1e-12 and abs(high - 0.5) < 1e-12  # a point: the centre
    variances = {}
    for probe in ("centre", "uniform"):  # the root's own probes (its path statistics would
        # also hold its children's, at other points of the slope)
        policy = MemoryBoundedDescent(probe=probe, lipschitz=0.01, max_nodes=1 + arity,
                                      stats="own")
        run(policy, problem, budget=400.0, seed=1)
        root = policy._fs[0]
        variances[probe] = root[ex.M2] / (root[ex.COUNT] - 1)
    assert 0.5 * 0.1**2 < variances["centre"] < 1.5 * 0.1**2
    assert variances["uniform"] > 0.1**2 + 1 / 24  # the slope's variance over [0, 1) is 1/12


@pytest.mark.parametrize("lipschitz, sigma", [(0.05, 0.1), (0.5, 0.3)])
def test_variance_split_is_one_standard_error_within_the_spread(lipschitz, sigma):
    """``split="variance"``: the root splits at the first ``T`` with ``T spread^2 >=
    max(V_hat, sigma^2)``: after ``ceil(sigma^2 / spread^2)`` equal observations (the noise's
    floor), later when the observations vary more than the noise."""
    spec = ProblemSpec(LazyTree(2), sigma, 1.0, 1.0)
    for values, first in ((np.full(400, 0.5), max(2, math.ceil(sigma**2 / lipschitz**2))),
                          (np.tile([0.0, 1.0], 200), None)):
        policy = MemoryBoundedDescent(split="variance", lipschitz=lipschitz, probe="uniform")
        policy.start(spec, budget=400.0, seed=0)
        told = 0
        while policy._ist[0, ex.FIRST] < 0:
            policy.tell(policy.ask(), float(values[told]))
            told += 1
        if first is not None:
            assert told == first
        else:  # V_hat of alternating 0, 1 is about 1/4, above sigma^2
            assert told >= 0.25 / lipschitz**2 - 1
            assert told > sigma**2 / lipschitz**2


def test_variance_split_refines_sooner_than_eq6():
    """Without Eq. 6's ``ln t`` the variance-scaled rule reaches deeper in the same rounds
    (finite tree and lazy tree)."""
    problem = tree_lipschitz(2, 10, seed=0)
    stored = {split: run(policy := OptimisticDescent(split=split), problem, budget=4_000,
                         seed=0) and policy.max_stored_ for split in ("eq6", "variance")}
    assert stored["variance"] > 1.5 * stored["eq6"]
    depth = {}
    for split in ("eq6", "variance"):
        policy = MemoryBoundedDescent(split=split, probe="uniform", forget="any",
                                      max_nodes=10**6)
        run(policy, infinite_depth(3), budget=3_000, seed=0)
        depth[split] = policy.depth_reached_
    assert depth["variance"] > depth["eq6"]


def test_balanced_forgetting_keeps_two_equal_peaks_under_a_tight_cap():
    """Two equal peaks, the default cap: forgetting any cell passes memory back and forth
    between them; the balanced rule keeps both and pays about what no cap pays. With a split
    cell's own statistics (``stats="own"``) the round trip costs most (3 seeds: 96 against
    64, uncapped 52); with the default path statistics a forgotten cell keeps its subtree's
    probes and the round trip costs less (55 against 47, uncapped 47)."""
    problem = FunctionOnInterval(LazyTree(2), _two_peaks, sigma=0.1)
    for stats, margin, cap_margin in (("own", 0.8, 1.25), ("path", 0.9, 1.1)):
        balanced, forgetful, uncapped = (
            np.mean(_final_regrets(partial(MemoryBoundedDescent, stats=stats, **options),
                                   problem, 3_000))
            for options in ({}, {"forget": "any"}, {"max_nodes": 10**6}))
        assert balanced < margin * forgetful
        assert balanced < cap_margin * uncapped


def test_memory_bounded_default_cap_and_certified_spread():
    problem = infinite_depth(3)
    for spread in ("assumed", "estimated", "certified"):
        policy = MemoryBoundedDescent(spread=spread)
        run(policy, problem, budget=3_000, seed=1)
        cap = 2 * 3 * math.ceil(math.log(3_000, 3)) + 1
        assert policy.max_stored_ <= cap
        assert policy.recommend(3).shape == (3, 2)


def test_same_seed_same_result_and_budget_with_costs():
    tree = Tree.complete(3, 5)
    rng = np.random.default_rng(5)
    problem = LeafMeans(tree, rng.uniform(0, 1, tree.n_leaves), sigma=0.2, probe_cost=0.3,
                        leaf_cost=1.0)
    budget = 500.7
    for kwargs in VARIANTS.values():
        first = run(OptimisticDescent(**kwargs), problem, budget=budget, seed=11, record=True)
        second = run(OptimisticDescent(**kwargs), problem, budget=budget, seed=11, record=True)
        assert first.spent <= budget * (1 + 1e-12)  # the ledger's own float tolerance
        assert first.history.nodes == second.history.nodes
        assert first.history.values == second.history.values
        assert np.array_equal(first.recommendation, second.recommendation)


def test_leaf_queries_on_full_tree_leaves_only():
    problem = tree_lipschitz(2, 3, seed=2)
    result = run(OptimisticDescent(expand="always"), problem, budget=400, seed=0, record=True)
    tree = problem.tree
    for is_probe, node in zip(result.history.is_probe, result.history.nodes, strict=True):
        assert is_probe == (not tree.is_leaf(node))
    assert result.n_leaf_evals > 0


def test_recommend_ranks_leaves_best_first():
    problem = tree_lipschitz(4, 4, seed=3)
    policy = OptimisticDescent(expand="always")
    result = run(policy, problem, budget=12_000, seed=3, k=5)
    top = result.recommendation
    assert len(set(top.tolist())) == 5
    assert problem.mu_star - problem.means[top[0]] < 0.05
    assert np.mean(problem.means[top]) > np.quantile(problem.means, 0.9)
    with pytest.raises(ValueError, match="k must be"):
        policy.recommend(0)


def test_memory_follows_explored_nodes_not_tree_size():
    tree = Tree.complete(2, 20)
    made = []

    def factory():
        made.append(OptimisticDescent(expand="always"))
        return made[-1]

    assert policy_overhead_us(factory, tree, 2_000, seed=0) > 0
    policy = made[-1]
    assert policy.max_stored_ <= 2 * 2_000 + 1
    assert policy._fs.shape[0] <= 2 * (policy.max_stored_ + 2)  # capacity doubling


def test_asynchronous_asks_and_tells():
    problem = tree_lipschitz(2, 4, seed=0)
    policy = OptimisticDescent().start(problem.spec, budget=50, seed=0)
    rng = np.random.default_rng(0)
    queries = [policy.ask() for _ in range(5)]
    assert len(set(queries)) == 1  # no tell yet: the descent repeats
    for query in reversed(queries):
        policy.tell(query, problem.probe(query.node, rng))
    with pytest.raises(ValueError, match="not asked"):
        policy.tell(queries[0], 0.5)


def test_kernel_spread_lower_matches_certificate():
    rng = np.random.default_rng(4)
    running = RunningCertificate(64, 0.1)
    running.update_many(rng.uniform(0, 1, 300) + 0.1 * rng.standard_normal(300))
    for delta in (0.05, 0.2):
        expected = running.certificate().spread_lower(delta)
        assert ex.spread_lower(running.state, 0.1, delta, 3.0) == pytest.approx(expected)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_rejects_non_finite_observations(value):
    problem = tree_lipschitz(2, 3, seed=0)
    policy = OptimisticDescent(spread="certified").start(problem.spec, budget=10, seed=0)
    query = policy.ask()
    with pytest.raises(ValueError, match="not finite"):
        policy.tell(query, value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lipschitz=-1.0), "lipschitz"),
    (dict(lipschitz=0.0), "lipschitz"),
    (dict(rho=1.0), "rho"),
    (dict(rho=0.0), "rho"),
    (dict(c=0.0), "c must"),
    (dict(c=-2.0), "c must"),
    (dict(expand="fixed"), "max_depth"),
    (dict(expand="sometimes"), "expand"),
    (dict(spread="guessed"), "spread"),
    (dict(max_depth=-1), "max_depth"),
    (dict(delta=1.5), "delta"),
    (dict(z=0.0), "z must"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OptimisticDescent(**kwargs)


def test_bad_memory_bounded_parameters_and_wrong_trees():
    with pytest.raises(ValueError, match="spread"):
        MemoryBoundedDescent(spread="hybrid")
    with pytest.raises(ValueError, match="lipschitz"):
        MemoryBoundedDescent(lipschitz=-0.5)
    with pytest.raises(ValueError, match="max_nodes"):
        MemoryBoundedDescent(max_nodes=2).start(ProblemSpec(LazyTree(3), 0.1, 1.0, 1.0),
                                                budget=10)
    with pytest.raises(TypeError, match="LazyTree"):
        MemoryBoundedDescent().start(ProblemSpec(Tree.complete(2, 2), 0.1, 1.0, 1.0),
                                     budget=10)
    with pytest.raises(TypeError, match="finite Tree"):
        OptimisticDescent().start(ProblemSpec(LazyTree(3), 0.1, 1.0, 1.0), budget=10)


def test_names():
    assert OptimisticDescent(spread="hybrid").name == "descent-hybrid"
    assert OptimisticDescent(spread="estimated").name == "descent-estimated"
    assert MemoryBoundedDescent.name == "memory-bounded"


def _short_and_base_path_runs(make, problem, budget):
    """The same run three times: told with the very query asked and a float, or a numpy float
    (the short path), and with an equal rebuilt query (the base class's path)."""
    runs = []
    for told in (lambda q, x: (q, x), lambda q, x: (q, np.float64(x)),
                 lambda q, x: (Query(*q), x)):
        policy = make().start(problem.spec, budget=budget, seed=0)
        rng = np.random.default_rng(1)
        asked = []
        while (query := policy.ask()) is not None:
            asked.append(query)
            policy.tell(*told(query, problem.probe(query.node, rng)))
        runs.append((asked, policy.recommend(2).tolist(), policy.ledger_.spent,
                     policy._fs.tobytes()))  # the explored tree's statistics, bit for bit
    return runs


@pytest.mark.parametrize("lazy", [False, True])
def test_the_short_ask_tell_path_plays_as_the_base_class_path(lazy):
    if lazy:
        problem, make = infinite_depth(2), MemoryBoundedDescent
    else:
        problem, make = tree_lipschitz(2, 6, seed=0), OptimisticDescent
    short, short_numpy, base = _short_and_base_path_runs(make, problem, 300.0)
    assert short == short_numpy == base
    assert len(short[0]) == 300


@pytest.mark.parametrize("lazy", [False, True])
def test_the_short_ask_tell_path_keeps_every_error(lazy):
    tree = LazyTree(2) if lazy else Tree.complete(2, 4)
    spec = ProblemSpec(tree, 0.1, 1.0, 1.0, value_range=(0.0, 1.0))
    make = MemoryBoundedDescent if lazy else OptimisticDescent
    with pytest.raises(RuntimeError, match="start"):
        make().ask()
    with pytest.raises(RuntimeError, match="start"):
        make().tell(Query("probe", 0), 0.5)
    policy = make().start(spec, budget=10.0, seed=0)
    query = policy.ask()
    for value, error, match in ((math.nan, ValueError, "not finite"),
                                (math.inf, ValueError, "not finite"),
                                (np.float64(-math.inf), ValueError, "not finite"),
                                (1.5, ValueError, "outside the declared range"),
                                (np.float64(-0.5), ValueError, "outside the declared range"),
                                ("0.5", TypeError, "real number")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and no numpy warning on the way
            with pytest.raises(error, match=match):
                policy.tell(query, value)
    other = Query("probe", (9, 3) if lazy else 5)
    with pytest.raises(ValueError, match="not asked"):
        policy.tell(other, 0.5)
    policy.tell(query, 0.5)  # still outstanding after every refusal
    with pytest.raises(ValueError, match="already told"):
        policy.tell(query, 0.5)
    query = policy.ask()
    policy.abandon(query, refund=True)
    with pytest.raises(ValueError, match="not asked"):
        policy.tell(query, 0.5)
    assert policy.ledger_.spent == 1.0
