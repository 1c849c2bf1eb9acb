"""Identification policies: recall against baselines, violations, budget, irregular trees.

Fidelity instance family (App. D, reused by the experiments): ``tree_lipschitz(4, 5,
lipschitz=1.0, sigma=SIGMA)``, 1,024 leaves, with ``SIGMA = L rho^D = 1/1024`` rounded to
0.001: the noise of one evaluation equals the finest resolution of the Lipschitz schedule, so
sibling leaves are just separable by one evaluation. Top-5, budget 1,500 leaf-cost units.
"""

import numpy as np
import pytest

from canopy.instances import piecewise_lipschitz, tree_lipschitz
from canopy.metrics import recall_at_k
from canopy.policies.baselines import SuccessiveElimination, Uniform
from canopy.policies.identify import EdgeTargeted, TopKBeam, TopKSound
from canopy.problem import LeafMeans, Query
from canopy.run import run
from canopy.tree import Tree

SIGMA = 0.001
CANOPY = [
    lambda: TopKBeam(k=5),
    lambda: TopKBeam(k=5, spread="hybrid"),
    lambda: TopKSound(k=5),
    lambda: TopKSound(k=5, spread="assumed"),
    lambda: EdgeTargeted(k=5),
]


def mean_recall(make, *, probe_cost, budget, seeds, depth=5):
    scores = []
    for seed in range(seeds):
        problem = tree_lipschitz(4, depth, lipschitz=1.0, sigma=SIGMA, probe_cost=probe_cost,
                                 seed=100 + seed)
        result = run(make(), problem, budget=budget, seed=seed, k=5)
        assert result.spent <= budget
        scores.append(recall_at_k(result.recommendation, problem.top_k(5)))
    return float(np.mean(scores))


@pytest.mark.parametrize("make", CANOPY)
def test_every_canopy_policy_beats_uniform_on_a_smooth_instance(make):
    ours = mean_recall(make, probe_cost=0.05, budget=600, seeds=8)
    uniform = mean_recall(Uniform, probe_cost=0.05, budget=600, seeds=8)
    assert ours >= uniform + 0.1


@pytest.mark.slow
def test_fidelity_beam_and_sound_against_successive_elimination():
    seeds = 20
    se = mean_recall(lambda: SuccessiveElimination(k=5), probe_cost=0.05, budget=1500,
                     seeds=seeds)
    beam = mean_recall(lambda: TopKBeam(k=5), probe_cost=0.05, budget=1500, seeds=seeds)
    sound = mean_recall(lambda: TopKSound(k=5, spread="assumed"), probe_cost=0.05,
                        budget=1500, seeds=seeds)
    assert beam >= 0.84
    assert beam >= se + 0.05
    assert sound >= se
    beam_flat = mean_recall(lambda: TopKBeam(k=5), probe_cost=1.0, budget=1500, seeds=seeds)
    assert beam_flat <= beam - 0.03  # the descent costs more when probes are not cheap


def violation_accuracy(make, n_violations, seeds):
    hits, recovered = [], []
    for seed in range(seeds):
        planted = piecewise_lipschitz(4, 5, n_violations, sigma=0.1, probe_cost=0.05,
                                      seed=1000 + seed)
        policy = make()
        result = run(policy, planted.problem, budget=400, seed=seed)
        assert result.spent <= 400
        hits.append(result.recommendation[0] == planted.problem.best_leaf)
        recovered.append(getattr(policy, "n_violations_", 0))
    return float(np.mean(hits)), float(np.mean(recovered))


@pytest.mark.slow
def test_violations_edge_beats_assumed_and_blind_and_recovers_count():
    seeds = 12
    totals = {"edge": 0.0, "assumed": 0.0, "blind": 0.0}
    recovered = {0: violation_accuracy(EdgeTargeted, 0, seeds)[1]}
    for k in (1, 4, 16):
        edge, recovered[k] = violation_accuracy(EdgeTargeted, k, seeds)
        totals["edge"] += edge
        totals["assumed"] += violation_accuracy(
            lambda: TopKBeam(spread="assumed", lipschitz=0.5), k, seeds)[0]
        totals["blind"] += violation_accuracy(SuccessiveElimination, k, seeds)[0]
    assert totals["edge"] >= totals["assumed"] + 0.5
    assert totals["edge"] >= totals["blind"] + 0.5
    assert recovered[0] <= 0.1  # smooth cells are (almost) never flagged
    assert recovered[16] > recovered[4] > recovered[1] >= 0.5


def test_flagged_cells_are_planted_cells_or_their_ancestors():
    planted = piecewise_lipschitz(4, 5, 8, sigma=0.1, probe_cost=0.05, seed=7)
    policy = EdgeTargeted(detect_fraction=0.6)
    run(policy, planted.problem, budget=2000, seed=7)
    tree = planted.problem.tree
    ancestors = {a for cell in planted.violation_cells for a in tree.path_to_root(int(cell))}
    assert policy.flagged_cells_.size >= 4
    assert set(policy.flagged_cells_.tolist()) <= ancestors
    assert policy.n_violations_ <= 8


def irregular_problem(seed=0):
    rng = np.random.default_rng(seed)
    features = np.concatenate([rng.normal(c, 0.3, size=(60, 2)) for c in range(5)])
    tree = Tree.from_features(features, branching=3, depth=3, seed=seed)
    means = np.clip(0.2 + 0.12 * features[tree.row_of_leaf, 0], 0, 1)
    return LeafMeans(tree, means, sigma=0.05, probe_cost=0.05)


@pytest.mark.parametrize("make", [*CANOPY, lambda: TopKBeam(spread="certified", width=3)])
def test_irregular_trees_async_budget_and_determinism(make):
    problem = irregular_problem()
    assert len(set(problem.tree.level[problem.tree.leaf_node].tolist())) > 1
    policy = make().start(problem.spec, budget=120.0, seed=3)
    rng = np.random.default_rng(3)
    while True:
        batch = [q for q in (policy.ask() for _ in range(5)) if q is not None]
        if not batch:
            break
        for query in batch:
            value = (problem.probe(query.node, rng) if query.kind == "probe"
                     else problem.evaluate(problem.spec.leaf_of(query.node), rng))
            policy.tell(query, value)
    assert policy.spent <= 120.0
    top = policy.recommend(problem.tree.n_leaves)
    assert sorted(top.tolist()) == list(range(problem.tree.n_leaves))
    picked = problem.means[policy.recommend(5)]
    assert picked.mean() >= problem.means.mean() + 0.1  # far better than chance
    first = run(make(), problem, budget=80, seed=5, k=5).recommendation
    again = run(make(), problem, budget=80, seed=5, k=5).recommendation
    assert np.array_equal(first, again)


def test_bad_input():
    problem = tree_lipschitz(2, 3, probe_cost=0.05)
    with pytest.raises(ValueError, match="spread"):
        TopKBeam(spread="optimistic")
    with pytest.raises(ValueError, match="prepass"):
        TopKSound(spread="assumed", prepass=False)
    with pytest.raises(ValueError, match="width"):
        TopKBeam(width=0)
    with pytest.raises(ValueError, match="detect_fraction"):
        EdgeTargeted(detect_fraction=1.5)
    with pytest.raises(TypeError, match="lipschitz"):
        EdgeTargeted(lipschitz="big")
    with pytest.raises(ValueError, match="budget"):
        TopKBeam().start(problem.spec, budget=0.01, seed=0)
    policy = EdgeTargeted().start(problem.spec, budget=20, seed=0)
    with pytest.raises(ValueError, match="k must be in"):
        policy.recommend(9)
    query = policy.ask()
    with pytest.raises(ValueError, match="not finite"):
        policy.tell(query, float("nan"))
    with pytest.raises(ValueError, match="not asked"):
        policy.tell(Query("leaf", 99), 0.3)
    with pytest.raises(IndexError):
        problem.spec.check_query(Query("leaf", 99))


def test_edge_targeted_keeps_shallow_leaves_of_an_irregular_tree_as_candidates():
    # root -> 4 internal cells of 16 leaves each (means ~0.3) and 4 leaves hanging from the
    # root itself, one of them the best (0.9); detection cells sit below the shallow leaves.
    parents = [-1] + [0] * 4 + [0] * 4
    for cell in range(1, 5):
        parents += [cell] * 16
    tree = Tree.from_parents(parents)
    means = np.full(tree.n_leaves, 0.3)
    shallow = [int(tree.node_leaf[node]) for node in range(5, 9)]
    means[shallow] = [0.9, 0.5, 0.45, 0.4]
    problem = LeafMeans(tree, means, sigma=0.1, probe_cost=0.05)
    hits = sum(run(EdgeTargeted(), problem, budget=60.0, seed=seed).recommendation[0]
               == shallow[0] for seed in range(10))
    assert hits >= 9
