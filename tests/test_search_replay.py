"""Offline replay on the logged MATH answers: selectors never read correctness, budgets are
respected, the multi-fidelity selector spends reward calls only where the votes are contested,
and the results are reproducible bit for bit."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from canopy.apps.search.replay import METHODS, LoggedProblem, load_logged, replay
from canopy.bootstrap import bootstrap_mean, paired_bootstrap


@pytest.fixture
def logged(data_file):
    return load_logged(data_file("qwen25math_rm", "math_cot_100.jsonl"))


def _problem(answers, rewards, correct):
    return LoggedProblem("q", tuple(answers), np.asarray(rewards, float),
                         np.asarray(correct, bool), np.full(len(answers), 100))


def test_logged_data_shape(logged):
    assert len(logged) == 100
    assert all(p.n_samples == 8 for p in logged)
    # the reward model is informative: correct answers score higher on average
    rewards = np.concatenate([p.rewards for p in logged])
    correct = np.concatenate([p.correct for p in logged])
    assert rewards[correct].mean() > rewards[~correct].mean() + 1.0


def test_selection_never_reads_correctness(logged):
    flipped = [replace(p, correct=~p.correct) for p in logged[:30]]
    kwargs = {"budgets": [2, 4, 8], "n_orders": 3, "seed": 5}
    a, b = replay(logged[:30], **kwargs), replay(flipped, **kwargs)
    for method in METHODS:
        # every pick graded right under one labelling is graded wrong under the other
        np.testing.assert_allclose(a.accuracy[method] + b.accuracy[method], 1.0)
        np.testing.assert_array_equal(a.generations[method], b.generations[method])


def test_budgets_are_never_exceeded(logged):
    result = replay(logged[:40], budgets=[1, 3, 5, 8, 16], n_orders=4, rm_cost=1.5, seed=1)
    for method in METHODS:
        spent = result.generations[method] + 1.5 * result.reward_calls[method]
        assert np.all(spent <= np.array(result.budgets) + 1e-9), method


def test_replay_table_at_matched_budgets(logged):
    result = replay(logged, budgets=[4, 8], n_orders=5, seed=0)
    rows = {(r.method, r.budget): r for r in result.rows(n_resamples=1000, seed=0)}
    for budget in (4.0, 8.0):
        mf, bon = rows["multi_fidelity", budget], rows["best_of_n", budget]
        first = rows["first", budget]
        # selection beats a single sample on this data (paired, interval above zero)
        assert bon.delta is None and first.delta is not None and first.delta.high < 0
        # the multi-fidelity selector is not worse than best-of-N beyond noise ...
        assert mf.delta is not None and mf.delta.low > -0.02
        # ... while spending a small fraction of best-of-N's reward-model calls
        assert mf.reward_calls < 0.25 * bon.reward_calls
        assert mf.calls <= budget + 1e-9
        assert mf.accuracy.low <= mf.accuracy.estimate <= mf.accuracy.high


def test_multi_fidelity_spends_reward_only_on_contested_problems():
    agree = _problem(["4"] * 8, np.arange(8.0), [True] * 8)
    split = _problem(["1", "2"] * 4, [0, 5, 0, 5, 0, 5, 0, 5], [False, True] * 4)
    result = replay([agree, split], budgets=[8], methods=["multi_fidelity", "majority"],
                    n_orders=20, seed=3)
    per_problem = result.accuracy
    assert per_problem["multi_fidelity"][0, 0] == 1.0
    # on the split problem the votes are uninformative; the reward picks the right cluster
    assert per_problem["multi_fidelity"][0, 1] == 1.0
    assert 0.2 < per_problem["majority"][0, 1] < 0.8
    alone = replay([agree], budgets=[8], methods=["multi_fidelity"], n_orders=5, seed=3)
    assert alone.reward_calls["multi_fidelity"][0] == 0
    assert alone.generations["multi_fidelity"][0] == 8


def test_replay_is_reproducible_and_seed_dependent(logged):
    kwargs = {"budgets": [3, 6], "n_orders": 2}
    a, b = replay(logged[:50], seed=11, **kwargs), replay(logged[:50], seed=11, **kwargs)
    c = replay(logged[:50], seed=12, **kwargs)
    for method in METHODS:
        np.testing.assert_array_equal(a.accuracy[method], b.accuracy[method])
    assert any(not np.array_equal(a.accuracy[m], c.accuracy[m]) for m in METHODS)


@pytest.mark.parametrize("kwargs, match", [
    ({"budgets": [0]}, "budgets"),
    ({"budgets": []}, "budgets"),
    ({"budgets": [4], "methods": ["nope"]}, "unknown methods"),
    ({"budgets": [4], "rm_cost": -1.0}, "rm_cost"),
    ({"budgets": [4], "n_orders": 0}, "n_orders"),
])
def test_bad_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        replay([_problem(["1"], [0.0], [True])], **kwargs)


def test_malformed_log_line_is_named(tmp_path):
    good = {"question": "q", "pred": ["1", "2"], "pred_score": [[0.1], [0.2]],
            "score": [True, False], "response": ["a", "b"]}
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "pred": ["1"]}) + "\n")
    with pytest.raises(ValueError, match=r"log\.jsonl:2: "):
        load_logged(path)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"log\.jsonl:2: "):
        load_logged(path)


def test_bootstrap_intervals_cover_and_pair():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(200):
        sample = rng.random(60) < 0.7
        interval = bootstrap_mean(sample, n_resamples=500, seed=rng)
        covered += interval.low <= 0.7 <= interval.high
    assert 0.88 <= covered / 200 <= 0.99
    # pairing removes shared item difficulty: a constant gap has a zero-width interval
    base = rng.random(50)
    gap = paired_bootstrap(base + 0.1, base, n_resamples=200)
    assert gap.low == pytest.approx(0.1) and gap.high == pytest.approx(0.1)
    with pytest.raises(ValueError, match="pair"):
        paired_bootstrap(base, base[:-1])
