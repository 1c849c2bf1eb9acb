"""Trimmers, BBH parsing, the regional trimming bandit, the summary and the CLI's checks,
without a model: the bandit is checked statistically on outcome matrices with known best
levels."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from canopy.apps.trim.bandit import (
    category_oracle,
    oracle,
    regional_bandit,
    trim_outcomes,
)
from canopy.apps.trim.run import TrimRun, summarise
from canopy.apps.trim.trimmers import (
    approx_tokens,
    default_levels,
    keep_first,
    keep_last,
    render_query,
    select_chunks,
)
from canopy.cli import app
from canopy.tasks.bbh import Item, grade, load_task, parse_cot_prompt

TEXT = " ".join(f"word{i}" for i in range(200))


def test_truncation_respects_the_requested_tokens_and_the_right_end():
    head, tail = keep_first(TEXT, 50), keep_last(TEXT, 50)
    assert approx_tokens(head) <= 50 and approx_tokens(tail) <= 50
    assert approx_tokens(head) >= 45 and approx_tokens(tail) >= 45
    assert TEXT.startswith(head) and TEXT.endswith(tail)
    assert keep_first("short", 50) == "short"


def test_bm25_keeps_the_chunks_about_the_question_within_budget():
    chunks = ["The cat sat on the mat.", "Stock prices fell sharply on Monday.",
              "A cat chased the mouse around the mat.", "Rainfall totals were recorded.",
              "The committee met on Tuesday.", "Trains were delayed by snow.",
              "The recipe needs two eggs.", "Voters went to the polls."]
    kept = select_chunks(chunks, "where did the cat sit on the mat", 20)
    assert kept == [0, 2]
    assert sum(approx_tokens(chunks[i]) + 1 for i in kept) <= 20
    assert select_chunks(chunks, "cat", 1) == []


def test_bbh_prompts_parse_into_three_shots_and_levels_shrink(data_file):
    folder = data_file("bbh", "cot-prompts/navigate.txt").parent.parent
    prompt, items = load_task(folder, "navigate", n=4, offset=2)
    assert len(prompt.shots) == 3 and len(items) == 4
    assert prompt.shots[0].answer == "No" and "origin" in prompt.shots[0].rationale
    lengths = {}
    for level in default_levels(budget_tokens=200):
        query = render_query(level.build(prompt, items[0].question), items[0].question)
        lengths[level.name] = approx_tokens(query)
        assert query.endswith(f"Q: {items[0].question}\nA:")
        if level.requested_tokens is not None:
            assert lengths[level.name] <= level.requested_tokens
    assert lengths["full"] > lengths["shots2"] > lengths["shots1"] > lengths["shots0"]
    assert lengths["answers_only"] < lengths["full"]


def test_grading_is_exact_match_after_normalising():
    item = Item("t", "q", "(B)")
    assert grade("Let's see. So the answer is (B).", item)
    assert grade(" (B)\nmore", item)
    assert not grade("So the answer is (C).", item)
    assert grade("the answer is yes.", Item("t", "q", "Yes"))


def test_malformed_prompt_file_is_a_clear_error():
    with pytest.raises(ValueError, match="shot 1"):
        parse_cot_prompt("-----\nInstruction.\n\nQ: a question\nA: no final answer here")


LAM = 5e-4
LEVEL_TOKENS = np.array([600.0, 300.0, 150.0, 50.0])
# accuracy of each level per category: "a" needs the full prompt, "b" does as well with half,
# "c" does not care (so the shortest level is best there)
ACCURACY = {"a": [0.9, 0.5, 0.3, 0.2], "b": [0.85, 0.8, 0.4, 0.3], "c": [0.5, 0.5, 0.5, 0.5]}


def _nested(rng, n_per_category):
    """Items of graded difficulty: item ``i`` is answered by level ``a`` when its difficulty
    is below the level's accuracy in its category (so longer prompts solve a superset)."""
    cats = np.repeat(list(ACCURACY), n_per_category)
    accuracy = np.array([ACCURACY[c] for c in cats])
    correct = (rng.random(cats.size)[:, None] < accuracy).astype(float)
    return trim_outcomes(cats, correct, np.tile(LEVEL_TOKENS, (cats.size, 1)))


def _reward(policy, lam=LAM):
    return float(policy.correct.mean() - lam * policy.tokens.mean())


def _fixed_rewards(outcomes, lam=LAM):
    return (outcomes.quality - lam * outcomes.cost).mean(axis=0)


def test_regional_bandit_beats_every_fixed_level_and_approaches_the_oracles():
    outcomes = _nested(np.random.default_rng(0), 300)
    out = regional_bandit(outcomes, lam=LAM, n_orders=5, seed=1)
    per_task, per_item = category_oracle(outcomes, lam=LAM), oracle(outcomes, lam=LAM)
    reward, best_fixed = _reward(out), float(_fixed_rewards(outcomes).max())
    # expected rewards: best fixed level 0.45, per-task oracle 0.575, per-item oracle 0.655
    assert reward > best_fixed + 0.04
    assert _reward(per_task) - 0.08 < reward < _reward(per_task)
    assert _reward(per_item) > _reward(per_task)
    # each category plays its own best level most (in "c" the two cheapest are 0.05 apart)
    cats = np.asarray(outcomes.regions)
    share = {c: out.choices[cats == c].mean(axis=0) for c in ACCURACY}
    assert np.argmax(share["a"]) == 0 and np.argmax(share["b"]) == 1
    assert share["c"][2:].sum() > 0.5
    again = regional_bandit(outcomes, lam=LAM, n_orders=5, seed=1)
    np.testing.assert_array_equal(out.correct, again.correct)


def test_regret_to_the_per_task_oracle_shrinks_with_more_items():
    gaps = []
    for n in (100, 1000):
        outcomes = _nested(np.random.default_rng(0), n)
        out = regional_bandit(outcomes, lam=LAM, n_orders=3, seed=1)
        gaps.append(_reward(category_oracle(outcomes, lam=LAM)) - _reward(out))
    assert gaps[1] < 0.6 * gaps[0]


def test_sharing_lets_small_categories_share_what_they_learn():
    """Eight categories of twelve items that share their best level (the live regime): the
    shared statistics (the test's rule, and the fixed back-off) find it far sooner than eight
    separate bandits (back-off weight 0)."""
    rng = np.random.default_rng(1)
    accuracy = np.array([0.1, 0.1, 0.05, 0.3, 0.6, 0.1, 0.1, 0.1])
    tokens = np.array([520.0, 380.0, 220.0, 50.0, 170.0, 270.0, 280.0, 230.0])
    cats = np.repeat([f"task{i}" for i in range(8)], 12)
    correct = (rng.random((cats.size, 8)) < accuracy).astype(float)
    outcomes = trim_outcomes(cats, correct, np.tile(tokens, (cats.size, 1)))
    separate = regional_bandit(outcomes, lam=2e-4, sharing="backoff", kappa=0.0, n_orders=10,
                               seed=1)
    for sharing in ("anytime", "test", "backoff"):
        pooled = regional_bandit(outcomes, lam=2e-4, sharing=sharing, n_orders=10, seed=1)
        assert _reward(pooled, 2e-4) > _reward(separate, 2e-4) + 0.1, sharing
        assert pooled.choice_share[4] > 0.5 > separate.choice_share[4], sharing


def test_thompson_learner_also_finds_the_per_category_levels():
    outcomes = _nested(np.random.default_rng(5), 300)
    out = regional_bandit(outcomes, lam=LAM, learner="thompson", n_orders=3, seed=2)
    assert _reward(out) > float(_fixed_rewards(outcomes).max()) + 0.04
    again = regional_bandit(outcomes, lam=LAM, learner="thompson", n_orders=3, seed=2)
    np.testing.assert_array_equal(out.tokens, again.tokens)


def test_oracles_dominate_every_fixed_level():
    outcomes = _nested(np.random.default_rng(3), 50)
    per_task, per_item = category_oracle(outcomes, lam=LAM), oracle(outcomes, lam=LAM)
    assert _reward(per_item) >= _reward(per_task) >= float(_fixed_rewards(outcomes).max())
    assert per_item.correct.mean() == pytest.approx(outcomes.quality.max(axis=1).mean())


def test_summary_rows_and_partial_runs():
    rng = np.random.default_rng(4)
    levels = default_levels(budget_tokens=100)
    n = 40
    items = [Item(f"task{i % 2}", f"q{i}", "x") for i in range(n)]
    correct = (rng.random((n, len(levels))) < 0.5).astype(float)
    tokens = np.tile(np.linspace(400, 50, len(levels)), (n, 1))
    run = TrimRun(items, levels, correct, tokens, tokens * 1.1, completed=30)
    run.correct[30:] = np.nan
    rows = summarise(run, n_orders=3, n_resamples=300)
    assert [r["method"] for r in rows] == (["adaptive (regional ucb)"]
                                           + [lv.name for lv in levels]
                                           + ["per-task oracle", "per-item oracle"])
    assert all(r["items"] == 30 for r in rows)
    for row in rows:
        assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]
    per_task, per_item = rows[-2], rows[-1]
    assert per_item["reward"] >= per_task["reward"] >= max(r["reward"] for r in rows[1:-2])
    assert summarise(TrimRun(items, levels, correct, tokens, tokens, completed=0)) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"lam": -1.0}, "lam"),
    ({"lam": 1e-3, "n_orders": 0}, "n_orders"),
    ({"lam": 1e-3, "learner": "greedy"}, "learner"),
    ({"lam": 1e-3, "kappa": -1.0}, "kappa"),
])
def test_bandit_rejects_bad_arguments(kwargs, match):
    outcomes = trim_outcomes(["t", "t"], np.zeros((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=match):
        regional_bandit(outcomes, **kwargs)


@pytest.mark.parametrize("correct, tokens, match", [
    (np.zeros((2, 3)), np.ones((2, 2)), "must be"),
    (np.full((2, 2), np.nan), np.ones((2, 2)), "NaN"),
    (np.full((2, 2), 2.0), np.ones((2, 2)), "quality"),
    (np.zeros((2, 2)), -np.ones((2, 2)), "cost"),
])
def test_trim_outcomes_rejects_bad_matrices(correct, tokens, match):
    with pytest.raises(ValueError, match=match):
        trim_outcomes(["t", "u"], correct, tokens)


@pytest.mark.parametrize("option", [["--learner", "greedy"], ["--kappa", "-1"],
                                    ["--orders", "0"]])
def test_cli_rejects_bad_bandit_settings_before_any_call(option):
    # an unreachable endpoint: a call would fail differently (and later)
    result = CliRunner().invoke(app, ["trim", "run", "--base-url", "http://127.0.0.1:9/v1",
                                      "--model", "m", *option])
    assert result.exit_code == 2
    assert option[0].removeprefix("--").rstrip("s") in result.output
