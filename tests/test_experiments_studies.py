"""The paper's synthetic studies on tiny grids: each runs through the runner, summarises,
reports headlines and writes its outputs; structural facts of the studies hold; bad
configurations fail before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from canopy.experiments.outputs import write_study
from canopy.experiments.runner import plan, run_study
from canopy.experiments.studies import available, get_study
from canopy.experiments.studies.theorylink import near_optimality_dimension
from canopy.experiments.study import PROPORTION
from canopy.experiments.summary import lookup
from canopy.problem import LeafMeans
from canopy.tree import Tree
from helpers import require_data

SYNTHETIC = ("fidelity", "memory", "violations", "compression", "ablation", "theorylink",
             "certificate", "discontinuities")

TINY = {
    "fidelity": {"ratios": "0.05,1", "budgets": "150", "budget": "150"},
    "memory": {"horizon": "600", "depths": "1,2"},
    "violations": {"ks": "0,2", "budget": "60"},
    "compression": {"horizons": "300,600"},
    "ablation": {"horizon": "600", "assumed": "0.1,1"},
    "theorylink": {"checkpoints": "100,200,400", "depth": "6"},
    "certificate": {"leaves": "4,64", "probes": "16,256", "trials": "40",
                    "methods": "paper,sharp", "shapes": "flat,one-spike"},
    "discontinuities": {"depth": "5", "ks": "0,2,8", "horizon": "1500"},
}


def test_registry_serves_every_synthetic_study():
    assert set(SYNTHETIC) <= set(available())
    for name in SYNTHETIC:
        study = get_study(name)
        assert study.name == name and study.seeds >= study.quick_seeds >= 1


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies")
    runs = {}
    for name in SYNTHETIC:
        study = get_study(name)
        runs[name] = run_study(study, store=out / name / "cells", seeds=2, workers=1,
                               overrides=TINY[name])
        write_study(study, runs[name], out)
    return out, runs


@pytest.mark.parametrize("name", SYNTHETIC)
def test_tiny_study_summarises_and_writes_outputs(tiny_runs, name):
    out, runs = tiny_runs
    result = runs[name]
    assert result.computed == result.n_tasks and result.seeds == 2
    assert result.rows and all(row.n == 2 for row in result.rows)
    document = json.loads((out / name / "results.json").read_text())
    assert document["study"] == name and len(document["rows"]) == len(result.rows)
    assert document["config"]["params"] == result.params
    assert (out / name / "figure.png").stat().st_size > 1000
    assert get_study(name).headlines(result.rows), "a tiny grid still yields headlines"


def test_identification_scores_are_proportions(tiny_runs):
    _, runs = tiny_runs
    metrics = set()
    for m in runs["fidelity"].measurements:
        assert m.metric in ("recall@5", "pruned fraction") and 0 <= m.value <= 1
        assert m.kind == PROPORTION  # declared, so its interval stays in [0, 1]
        metrics.add(m.metric)
    assert metrics == {"recall@5", "pruned fraction"}
    accuracy = [m.value for m in runs["violations"].measurements if m.metric == "top-1 accuracy"]
    assert set(accuracy) <= {0.0, 1.0}
    recovered = [m.value for m in runs["violations"].measurements if m.metric == "recovered K"]
    assert recovered and all(v >= 0 and v == int(v) for v in recovered)


def test_fixed_depth_play_stores_the_whole_tree_down_to_its_depth(tiny_runs):
    _, runs = tiny_runs
    stored = {(r.method, r.x): r.mean for r in runs["memory"].rows if r.metric == "stored nodes"}
    assert stored[("fixed depth", 1.0)] == 1 + 4
    assert stored[("fixed depth", 2.0)] == 1 + 4 + 16


def test_regret_grows_with_the_horizon_and_memory_stays_bounded(tiny_runs):
    _, runs = tiny_runs
    regret = [m.value for m in runs["theorylink"].measurements if m.metric == "R(n)"]
    assert all(np.diff(regret[:3]) > 0) and all(np.diff(regret[3:]) > 0)
    compression = runs["compression"].rows
    for row in compression:
        if row.metric == "peak stored nodes":
            tree = next(r for r in compression if r.metric == "tree nodes"
                        and r.method == row.method and r.x == row.x)
            assert row.mean <= tree.mean * 3 + 1  # stored: at most the tree plus one block


def test_certificate_study_covers_and_the_default_is_narrower(tiny_runs):
    _, runs = tiny_runs
    rows = runs["certificate"].rows
    coverage = [r.mean for r in rows if r.metric == "coverage"]
    assert coverage and min(coverage) >= 0.95
    width = {r.method: r.mean for r in rows if r.metric == "median width" and r.x == 256}
    assert width["sharp / flat / m=4"] < 0.5 * width["paper / flat / m=4"]


def test_excess_regret_stays_far_below_theorem_3s_jump_term(tiny_runs):
    """Theorem 3 bounds the excess regret over K = 0 by C2 K D ln n / Delta_min: measured, the
    excess per unit of that term is small at every K (the bound is far from tight here)."""
    from canopy.experiments.studies.discontinuities import HYBRID, TERM

    rows = tiny_runs[1]["discontinuities"].rows
    base = lookup(rows, HYBRID, "regret", 0.0)
    for k in (2.0, 8.0):
        regret, term = lookup(rows, HYBRID, "regret", k), lookup(rows, HYBRID, TERM, k)
        assert term.mean == pytest.approx(k * 5 * np.log(1500) / 0.1)
        assert (regret.mean - base.mean) / term.mean < 0.05


def test_near_optimality_dimension_on_hand_made_functions():
    tree = Tree.complete(2, 8)
    flat = LeafMeans(tree, np.full(tree.n_leaves, 0.5))
    assert near_optimality_dimension(flat, branching=2, lipschitz=1.0) == pytest.approx(1.0)
    spike = np.zeros(tree.n_leaves)
    spike[77] = 1.0
    peaked = LeafMeans(tree, spike)
    assert near_optimality_dimension(peaked, branching=2, lipschitz=1.0) == pytest.approx(0.0)


@pytest.mark.parametrize(("name", "overrides", "message"), [
    ("fidelity", {"budget": "0.5"}, "below the cost of one query"),
    ("violations", {"budget": "0.2"}, "below the cost of one query"),
    ("violations", {"ks": "0,300"}, "ks must lie in 0..256"),
    ("memory", {"depths": "5"}, "depths must lie in 1..4"),
    ("theorylink", {"checkpoints": "100"}, "at least two increasing horizons"),
    ("compression", {"lipschitz": "-1"}, "lipschitz must be a finite number > 0"),
    ("memory", {"sigma": "-0.1"}, "sigma must be a finite number >= 0"),
    ("ablation", {"horizon": "0"}, "horizon must be >= 1"),
    ("certificate", {"methods": "magic"}, "unknown method"),
])
def test_bad_study_configuration_fails_before_work(tmp_path, name, overrides, message):
    with pytest.raises(ValueError, match=message):
        run_study(get_study(name), store=tmp_path / "cells", overrides=overrides)
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        plan(get_study(name), seeds=-2)
    assert not (tmp_path / "cells").exists()


def test_lower_bound_error_is_a_constant_below_h_over_log_m_and_probes_are_blind(tmp_path):
    """Proposition 2 on a permuted cell of 8 leaves, 60 seeds: leaf-only search errs with
    constant probability at a quarter of h / log m and far less at 4 h / log m; the probes'
    mean is the cell's average whatever the permutation."""
    from canopy.experiments.studies.lowerbound import METHOD, PROBE_MEAN, PROBES, cell_average

    result = run_study(get_study("lowerbound"), store=tmp_path, seeds=60, workers=1,
                       overrides={"m": "8", "budgets": "0.25,4"})
    low = lookup(result.rows, METHOD, "top-1 error", 0.25)
    high = lookup(result.rows, METHOD, "top-1 error", 4.0)
    assert low.ci_low > 0.5  # random guessing errs 7/8 of the time
    assert high.mean < low.mean - 0.25
    probes = lookup(result.rows, PROBES, PROBE_MEAN)
    assert probes.ci_low <= cell_average(8) <= probes.ci_high


def test_misidentification_falls_with_the_budget_in_units_of_h_edge(tmp_path):
    """Theorem 2 on one-violation instances of two hardnesses, 30 seeds: the edge-targeted
    policy errs almost always at 8 H_edge and rarely at 256 H_edge, in both families."""
    from canopy.experiments.studies.misidentification import method

    result = run_study(get_study("misidentification"), store=tmp_path, seeds=30, workers=1,
                       overrides={"budgets": "8,256"})
    for jump in (0.15, 0.3):
        low = lookup(result.rows, method(jump), "top-1 error", 8.0)
        high = lookup(result.rows, method(jump), "top-1 error", 256.0)
        assert low.mean > 0.6 and high.mean < low.mean - 0.4


def test_eta_squared_on_hand_made_groups():
    from canopy.experiments.studies.variancesplit import eta_squared

    groups = np.array([0, 0, 1, 1])
    assert eta_squared(np.array([1.0, 1.0, 3.0, 3.0]), groups) == pytest.approx(1.0)
    assert eta_squared(np.array([1.0, 3.0, 1.0, 3.0]), groups) == pytest.approx(0.0)
    assert eta_squared(np.array([0.0, 2.0, 2.0, 4.0]), groups) == pytest.approx(0.5)


def test_variance_split_on_routellm_mmlu_is_far_above_chance(tmp_path):
    """The category tree's share of the routing value's variance (App. D; paper 31% / 53% on
    RouterBench), 4 bootstrap seeds: both shares sit well above what labels with no structure
    give, and near the paper's."""
    from canopy.experiments.studies.variancesplit import (
        METHOD,
        PROMPT,
        PROMPT_CHANCE,
        REGION,
        REGION_CHANCE,
    )

    require_data("routellm", "routellm/evals/mmlu/responses")
    rows = run_study(get_study("variancesplit"), store=tmp_path, seeds=4, workers=1).rows
    prompt, region = lookup(rows, METHOD, PROMPT), lookup(rows, METHOD, REGION)
    assert prompt.ci_low > 10 * lookup(rows, METHOD, PROMPT_CHANCE).mean
    assert region.ci_low > lookup(rows, METHOD, REGION_CHANCE).mean
    assert 0.1 < prompt.mean < 0.5 and 0.35 < region.mean < 0.75
