"""HOO and POO baselines: regret against mis-specified schedules and the grid's best."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canopy.instances import infinite_depth, tree_lipschitz
from canopy.metrics import cumulative_regret
from canopy.policies.descent import OptimisticDescent
from canopy.policies.hoo import HOO, POO, default_schedules, rho_schedules
from canopy.run import run

N = 10_000
SEEDS = range(3)


def mean_final_regret(make_policy, branching=2, depth=10):
    finals = []
    for seed in SEEDS:
        problem = tree_lipschitz(branching, depth, seed=seed)
        result = run(make_policy(), problem, budget=N, seed=seed, record=True)
        assert result.spent <= N
        finals.append(cumulative_regret(result, problem.value, problem.mu_star)[-1])
    return float(np.mean(finals))


def test_hoo_with_the_true_constant_beats_a_too_loose_one():
    correct = mean_final_regret(lambda: HOO(lipschitz=1.0))
    loose = mean_final_regret(lambda: HOO(lipschitz=10.0))
    assert correct < 0.8 * loose


def test_hoo_path_statistics_beat_splitting_after_one_own_probe():
    hoo = mean_final_regret(lambda: HOO(), 4, 4)
    # the same c on both sides (HOO's default, 1): the test is about the statistics kept
    always = mean_final_regret(lambda: OptimisticDescent(expand="always", c=1.0), 4, 4)
    assert hoo < 0.8 * always


def test_poo_within_a_factor_of_the_best_hoo_of_its_grid():
    grid = [(0.1, None), (1.0, None), (10.0, None)]
    poo = mean_final_regret(lambda: POO(schedules=grid))
    hoos = [mean_final_regret(lambda lip=lip: HOO(lipschitz=lip)) for lip, _ in grid]
    assert poo < 3.0 * min(hoos)
    assert poo < max(hoos)


def test_poo_default_grid_and_recommendation():
    problem = tree_lipschitz(4, 4, seed=1)
    policy = POO()
    result = run(policy, problem, budget=4_000, seed=1, k=3)
    assert len(policy.schedules_) == len(default_schedules(4_000)) >= 3
    assert len(set(result.recommendation.tolist())) == 3
    assert problem.mu_star - problem.means[result.recommendation[0]] < 0.1
    assert policy.n_stored_ == policy.max_stored_ > len(policy.schedules_)


def test_rho_grid_is_grill_et_al_s():
    grid = rho_schedules(N)
    d_max = math.log(2) / math.log(1 / 0.9)
    count = math.ceil(0.5 * d_max * math.log(N / math.log(N)))
    assert len(grid) == count
    assert [lip for lip, _ in grid] == [1.0] * count
    rhos = [rho for _, rho in grid]
    assert rhos == pytest.approx([0.9 ** (2 * count / (2 * i + 1)) for i in range(count)])
    assert 0 < rhos[0] < rhos[-1] < 0.9
    assert len(rho_schedules(N, arity=4)) > count  # a wider tree: a larger D_max
    with pytest.raises(ValueError, match="schedules"):
        POO(schedules="L")
    with pytest.raises(ValueError, match="arity"):
        rho_schedules(N, arity=1)
    with pytest.raises(ValueError, match="rho_max"):
        rho_schedules(N, rho_max=1.0)


def test_poo_over_rho_recommends_a_near_optimal_leaf():
    """POO over Grill et al.'s rho grid (c = the noise sd): the simple regret of its
    recommendation, mean over 3 seeds, against the grid over L and a uniform leaf."""
    simple = {"rho": [], "L": [], "uniform": []}
    for seed in SEEDS:
        problem = tree_lipschitz(2, 10, seed=seed)
        for name, schedules in (("rho", "rho"), ("L", None)):
            policy = POO(schedules=schedules, c=None)
            result = run(policy, problem, budget=N, seed=seed)
            simple[name].append(problem.mu_star - problem.means[result.recommendation[0]])
        simple["uniform"].append(problem.mu_star - problem.means.mean())
    assert len(policy.schedules_) == len(default_schedules(N))
    assert np.mean(simple["rho"]) < 0.05 * np.mean(simple["uniform"])
    assert np.mean(simple["rho"]) <= np.mean(simple["L"])


def test_hoo_on_an_infinite_tree_and_determinism():
    problem = infinite_depth(3)
    runs = [run(HOO(lipschitz=3.0, c=0.3), problem, budget=2_000, seed=4, record=True)
            for _ in range(2)]
    assert runs[0].history.nodes == runs[1].history.nodes
    assert runs[0].recommendation.shape == (1, 2)


def test_poo_tells_in_any_order():
    problem = tree_lipschitz(2, 5, seed=0)
    policy = POO(schedules=[(0.5, None), (2.0, 0.6)]).start(problem.spec, budget=40, seed=0)
    rng = np.random.default_rng(1)
    for _ in range(10):
        queries = [policy.ask() for _ in range(3)]
        for query in queries[::-1]:
            policy.tell(query, problem.probe(query.node, rng))
    assert policy.spent == 30


@pytest.mark.parametrize("make, match", [
    (lambda: HOO(lipschitz=-1.0), "lipschitz"),
    (lambda: HOO(rho=1.5), "rho"),
    (lambda: HOO(c=0.0), "c must"),
    (lambda: POO(schedules=[]), "schedules is empty"),
    (lambda: POO(schedules=[(1.0, None), (-2.0, None)]), r"schedules\[1\] lipschitz"),
    (lambda: POO(schedules=[(1.0, 1.0)]), r"schedules\[0\] rho"),
    (lambda: POO(c=-1.0), "c must"),
])
def test_bad_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rejects_nan():
    problem = tree_lipschitz(2, 3, seed=0)
    policy = HOO().start(problem.spec, budget=5, seed=0)
    with pytest.raises(ValueError, match="not finite"):
        policy.tell(policy.ask(), float("nan"))
