"""Structure-blind baselines: phase lengths, budget split, easy identification, bad input."""

import math

import numpy as np
import pytest

from canopy.policies._identify_core import halving_entrants, sr_schedule
from canopy.policies.baselines import (
    FlatUCB,
    SequentialHalving,
    SuccessiveElimination,
    SuccessiveRejects,
    Uniform,
)
from canopy.problem import LeafMeans, Query
from canopy.run import run
from canopy.tree import Tree

BEST = 11
BASELINES = [Uniform, SuccessiveElimination, SuccessiveRejects, SequentialHalving, FlatUCB]


def easy_problem(n_leaves: int = 16, sigma: float = 0.1) -> LeafMeans:
    tree = Tree.complete(2, int(math.log2(n_leaves)))
    means = np.full(n_leaves, 0.3)
    means[BEST % n_leaves] = 0.9
    return LeafMeans(tree, means, sigma=sigma, probe_cost=0.05)


def test_sr_schedule_is_audibert_and_fits_the_budget():
    n_arms, n = 10, 1000
    logbar = 0.5 + sum(1 / i for i in range(2, n_arms + 1))
    expected = [math.ceil((n - n_arms) / (logbar * (n_arms + 1 - j))) for j in range(1, n_arms)]
    schedule = sr_schedule(n_arms, n, keep=1)
    assert schedule.tolist() == expected
    for keep in (1, 3, 5):
        counts = sr_schedule(n_arms, n, keep)
        assert counts.size == n_arms - keep
        assert counts.sum() + keep * counts[-1] <= n


def test_halving_entrants_is_the_largest_field_that_fits():
    for keep in (1, 2, 5, 20):
        for n_pulls in range(0, 1500):
            fits = [a for a in range(keep + 1, n_pulls + 1)
                    if a * math.ceil(math.log2(a / keep)) <= n_pulls]
            assert halving_entrants(n_pulls, keep) == max(fits, default=keep)


@pytest.mark.parametrize("policy_cls", BASELINES)
def test_easy_best_arm_found_with_high_probability(policy_cls):
    problem = easy_problem()
    hits = [run(policy_cls(), problem, budget=200, seed=s).recommendation[0] == 11
            for s in range(20)]
    assert np.mean(hits) >= 0.95


def test_successive_rejects_splits_the_budget_as_scheduled():
    problem = easy_problem(n_leaves=8)
    result = run(SuccessiveRejects(), problem, budget=400, seed=3, record=True)
    leaves = [problem.spec.leaf_of(node) for node in result.history.nodes]
    counts = np.sort(np.bincount(leaves, minlength=8))
    schedule = sr_schedule(8, 400, keep=1)
    # the arm rejected in phase j has n_j evaluations; the winner has n_{K-1}
    assert counts.tolist() == sorted([*schedule.tolist(), schedule[-1]])
    assert result.spent <= 400


def test_sequential_halving_first_round_is_karnin():
    problem = easy_problem(n_leaves=16)
    budget = 640
    policy = SequentialHalving().start(problem.spec, budget=budget, seed=0)
    rng = np.random.default_rng(0)
    first_round = []
    while len(first_round) < 16 * (budget // (16 * 4)):
        query = policy.ask()
        first_round.append(problem.spec.leaf_of(query.node))
        policy.tell(query, problem.evaluate(first_round[-1], rng))
    counts = np.bincount(first_round, minlength=16)
    assert np.all(counts == budget // (16 * math.ceil(math.log2(16))))
    second_round = {problem.spec.leaf_of(policy.ask().node) for _ in range(8)}
    assert len(second_round) == 8 and BEST in second_round  # the best arm survives


def test_uniform_is_balanced_and_successive_elimination_eliminates():
    problem = easy_problem(n_leaves=32, sigma=0.05)
    result = run(Uniform(), problem, budget=100, seed=1, record=True)
    counts = np.bincount([problem.spec.leaf_of(n) for n in result.history.nodes], minlength=32)
    assert counts.max() - counts.min() <= 1
    policy = SuccessiveElimination()
    run(policy, problem, budget=3000, seed=1)
    assert policy.spent < 3000  # stopped once the best arm was the only survivor
    assert policy.recommend(1)[0] == 11


def test_flat_ucb_concentrates_on_the_best_leaf():
    problem = easy_problem(n_leaves=16)
    result = run(FlatUCB(), problem, budget=400, seed=2, record=True)
    counts = np.bincount([problem.spec.leaf_of(n) for n in result.history.nodes], minlength=16)
    assert counts.argmax() == 11 and counts[11] > 400 / 4


@pytest.mark.parametrize("policy_cls", BASELINES)
def test_budget_respected_with_several_asks_in_flight(policy_cls):
    problem = easy_problem(n_leaves=64)
    policy = policy_cls().start(problem.spec, budget=157.0, seed=4)
    rng = np.random.default_rng(4)
    while True:
        batch = [q for q in (policy.ask() for _ in range(7)) if q is not None]
        if not batch:
            break
        for query in batch:
            policy.tell(query, problem.evaluate(problem.spec.leaf_of(query.node), rng))
    assert policy.spent <= 157.0
    if policy_cls is SuccessiveRejects:  # spends exactly its schedule, which may leave slack
        schedule = sr_schedule(64, 157, keep=1)
        assert policy.spent == schedule.sum() + schedule[-1]
    else:
        assert policy.spent >= 150.0
    assert len(set(policy.recommend(64).tolist())) == 64


@pytest.mark.parametrize("policy_cls", BASELINES)
def test_bad_input_and_determinism(policy_cls):
    problem = easy_problem()
    with pytest.raises(ValueError, match="budget"):
        policy_cls().start(problem.spec, budget=0.5, seed=0)
    policy = policy_cls().start(problem.spec, budget=50, seed=0)
    with pytest.raises(ValueError, match="k must be in"):
        policy.recommend(17)
    query = policy.ask()
    with pytest.raises(ValueError, match="not finite"):
        policy.tell(query, float("nan"))
    with pytest.raises(ValueError, match="not asked"):
        policy.tell(Query("leaf", 10**6), 0.5)
    first = run(policy_cls(), problem, budget=60, seed=9).recommendation
    again = run(policy_cls(), problem, budget=60, seed=9).recommendation
    assert np.array_equal(first, again)


def test_constructor_validation():
    with pytest.raises(ValueError, match="delta"):
        SuccessiveElimination(delta=1.5)
    with pytest.raises(ValueError, match="k must"):
        SequentialHalving(k=0)
    with pytest.raises(ValueError, match="c must"):
        FlatUCB(c=-1.0)


@pytest.mark.parametrize("value", ["0.5", True, np.bool_(True), 0.5 + 0j, None])
def test_tell_refuses_what_is_not_a_real_number(value):
    problem = easy_problem(n_leaves=4)
    policy = Uniform().start(problem.spec, budget=8, seed=0)
    query = policy.ask()
    with pytest.raises(TypeError, match="real number"):
        policy.tell(query, value)
    policy.tell(query, np.float32(0.5))  # still outstanding; numpy reals are fine
    assert policy.spent == 1


def test_a_top_k_policy_refuses_more_winners_than_leaves_at_start():
    from canopy.policies import TopKBeam
    problem = easy_problem(n_leaves=16)
    for policy in (TopKBeam(k=10**6), SuccessiveElimination(k=17)):
        with pytest.raises(ValueError, match=r"k must be in 1\.\.16"):
            policy.start(problem.spec, budget=1000, seed=0)


def test_top_k_by_partial_selection_is_the_lexsort_prefix():
    from canopy.policies.base import top_k
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 300))
        keys = (rng.integers(0, 5, n).astype(float), rng.integers(0, 3, n).astype(float),
                rng.permutation(n).astype(float))
        tied = (np.where(rng.random(n) < 0.3, np.inf, keys[0]), keys[1])  # ties to the end
        for k in (1, 2, n // 2 + 1, n):
            assert top_k(k, *keys).tolist() == np.lexsort(keys[::-1])[:k].tolist()
            assert top_k(k, *tied).tolist() == np.lexsort(tied[::-1])[:k].tolist()


def _drive(policy, problem, p_lost, refund):
    rng, lost = np.random.default_rng(1), 0
    while (query := policy.ask()) is not None:
        if rng.random() < p_lost:
            policy.abandon(query, refund=refund)
            lost += 1
        else:
            value = (problem.probe(query.node, rng) if query.kind == "probe"
                     else problem.evaluate(problem.spec.leaf_of(query.node), rng))
            policy.tell(query, value)
    return lost


@pytest.mark.parametrize("refund", [False, True])
@pytest.mark.parametrize("make", [Uniform, SuccessiveElimination, SuccessiveRejects,
                                  SequentialHalving, "TopKBeam"])
def test_a_phased_policy_with_5_percent_of_queries_abandoned_spends_its_budget(make, refund):
    from canopy.policies import TopKBeam
    problem = easy_problem(n_leaves=16)
    runs = []
    for p_lost in (0.0, 0.05):
        policy = (TopKBeam(k=1) if make == "TopKBeam" else make()).start(
            problem.spec, budget=2000, seed=0)
        runs.append((policy, _drive(policy, problem, p_lost, refund)))
    (clean, _), (lossy, lost) = runs
    assert lost > 0
    refunded = lost * problem.spec.leaf_cost if refund else 0.0
    # no stall: what is left is what the clean run leaves, plus at most the refunds
    assert lossy.remaining <= clean.remaining + refunded + problem.spec.leaf_cost
    assert lossy.recommend(1)[0] == BEST
    with pytest.raises(ValueError, match="not asked"):
        lossy.abandon(Query("leaf", int(problem.spec.tree.leaf_node[0])))
