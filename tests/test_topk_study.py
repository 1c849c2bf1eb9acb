"""The methods on pools: budgets respected, the tree's gain where the tree explains the target,
and the ``realtopk`` study end to end on a small grid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from canopy.apps.topk import Pool, PoolProblem, tree_from_features
from canopy.apps.topk.select import METHODS, make_policy, select_top_k
from canopy.experiments.outputs import write_study
from canopy.experiments.runner import run_study
from canopy.experiments.studies import get_study
from canopy.experiments.studies.realtopk import Params, pool_problem


def clustered_pool(seed: int = 0) -> Pool:
    """400 candidates in 20 clusters of 20: one cluster holds every good candidate (0.40 to
    0.95), the others sit at 0.1 to 0.45; the features locate the clusters, not the ranks."""
    rng = np.random.default_rng(seed)
    level = np.r_[0.0, rng.uniform(0.1, 0.4, 19)]
    cluster = np.repeat(np.arange(20), 20)
    target = level[cluster] + 0.05 * rng.random(cluster.size)
    target[cluster == 0] = np.linspace(0.95, 0.40, 20)
    centre = np.where(cluster == 0, 0.9, level[cluster])
    features = np.clip(centre[:, None] + 0.02 * rng.standard_normal((cluster.size, 2)), 0, 1)
    return Pool("clustered", tuple(f"m{i}" for i in range(cluster.size)), target, "t",
                features, ("a", "b"))


def test_the_tree_finds_the_good_cluster_that_blind_methods_cannot_cover():
    pool = clustered_pool()
    problem = PoolProblem(pool, tree_from_features(pool, branching=5, depth=3, seed=0))
    recall = {method: np.mean([select_top_k(problem, k=5, budget=300, method=method,
                                            seed=seed).recall for seed in range(10)])
              for method in METHODS}
    # 300 leaf evaluations cannot even cover 400 candidates; probes of 0.05 locate the cluster
    assert recall["canopy"] >= 0.25
    for blind in ("successive-elimination", "uniform", "sequential-halving"):
        assert recall["canopy"] >= recall[blind] + 0.2


@pytest.mark.parametrize("method", list(METHODS))
def test_no_method_spends_past_its_budget(data_file, method):
    data_file("can-ai-code", "results_long.csv.gz")
    problem = pool_problem("can-ai-code", 0.05)
    for budget in (1.0, 7.3, 150.0):
        choice = select_top_k(problem, k=10, budget=budget, method=method, seed=1)
        assert choice.spent <= budget + 1e-9
        assert choice.spent == pytest.approx(0.05 * choice.n_probes + choice.n_leaf_evals)
        assert len(choice.names) == 10 and 0.0 <= choice.recall <= 1.0
    # asynchronous use: many queries outstanding before any answer
    policy = make_policy(method, k=10)
    policy.start(problem.spec, budget=25.0, seed=0)
    rng = np.random.default_rng(0)
    while True:
        batch = [query for query in (policy.ask() for _ in range(16)) if query is not None]
        if not batch:
            break
        for query in batch:
            leaf = problem.spec.leaf_of(query.node) if query.kind == "leaf" else None
            value = (problem.evaluate(leaf, rng) if leaf is not None
                     else problem.probe(query.node, rng))
            policy.tell(query, value)
    assert policy.spent <= 25.0 + 1e-9


def test_params_are_validated():
    with pytest.raises(ValueError, match="unknown pool"):
        Params(pools=("routereval",))
    with pytest.raises(ValueError, match="unknown method"):
        Params(methods=("greedy",))
    with pytest.raises(ValueError, match="budget"):
        Params(budgets=(0.5,))


def test_study_end_to_end_on_a_small_grid(data_file, tmp_path):
    data_file("alpaca_eval", "weighted_alpaca_eval_gpt4_turbo_preference_matrix.csv")
    data_file("alpaca_eval", "annotations_long.csv.gz")
    study = get_study("realtopk")
    result = run_study(study, store=tmp_path / "cells", seeds=2, workers=1,
                       overrides={"pools": "alpaca-eval", "budgets": "20,60"})
    paths = write_study(study, result, tmp_path)
    document = json.loads(paths.results.read_text())
    recall = [row for row in document["rows"] if row["metric"] == "recall@10 (alpaca-eval)"]
    assert {(row["method"], row["x"]) for row in recall} == {
        (method, budget) for method in METHODS for budget in (20.0, 60.0)}
    assert all(0.0 <= row["mean"] <= 1.0 and row["n"] == 2 for row in recall)
    shares = [row for row in document["rows"] if row["metric"].startswith("variance explained")]
    assert [row["x"] for row in shares] == [1.0, 2.0, 3.0, 4.0]
    assert shares[-1]["mean"] == pytest.approx(1.0)
    paper = {(p["method"], p["x"]): p["value"] for p in document["paper"]}
    assert paper["canopy", 600.0] == 0.370 and paper["successive-elimination", 600.0] == 0.126
    assert paths.figure.exists() and paths.table_md.exists()


def test_headlines_skip_a_ratio_to_a_zero_baseline():
    from canopy.experiments.study import Row

    metric = "recall@10 (can-ai-code)"
    rows = [Row("successive-elimination", "budget", 600.0, metric, 0.0, 0.0, 0.0, 3),
            Row("canopy", "budget", 600.0, metric, 0.2, 0.1, 0.3, 3)]
    labels = [h.label for h in get_study("realtopk").headlines(rows)]
    assert "can-ai-code: canopy recall@10 at B=600" in labels
    assert not any("/ successive elimination" in label for label in labels)
