"""Trimmers, BBH parsing, the per-category bandit and the summary, without a model: the bandit
is checked statistically on outcome matrices with a known best level."""

from __future__ import annotations

import numpy as np
import pytest

from canopy.apps.trim.bandit import oracle, ucb_per_category
from canopy.apps.trim.bbh import Item, grade, load_task, parse_cot_prompt
from canopy.apps.trim.run import TrimRun, summarise
from canopy.apps.trim.trimmers import (
    approx_tokens,
    default_levels,
    keep_first,
    keep_last,
    render_query,
    select_chunks,
)

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


def _matrix(rng, n_per_task, accuracy, tokens, n_tasks=2):
    n_levels = len(accuracy)
    cats = np.repeat(np.arange(n_tasks), n_per_task)
    correct = (rng.random((cats.size, n_levels)) < np.asarray(accuracy)).astype(float)
    cost = np.tile(np.asarray(tokens, float), (cats.size, 1))
    return cats, correct, cost


def test_ucb_finds_the_best_level_per_category_and_beats_uniform():
    rng = np.random.default_rng(0)
    # level 1 is best under lam (nearly as accurate as level 0 at a third of the tokens)
    cats, correct, cost = _matrix(rng, 300, [0.8, 0.75, 0.3], [600, 200, 50])
    out = ucb_per_category(cats, correct, cost, lam=1e-3, n_orders=5, seed=1)
    assert out.choice_share[1] > 0.6
    reward = out.correct.mean() - 1e-3 * out.tokens.mean()
    uniform = (correct - 1e-3 * cost).mean()
    fixed_best = (correct[:, 1] - 1e-3 * cost[:, 1]).mean()
    assert reward > uniform + 0.05
    assert fixed_best - 0.15 < reward < fixed_best
    again = ucb_per_category(cats, correct, cost, lam=1e-3, n_orders=5, seed=1)
    np.testing.assert_array_equal(out.correct, again.correct)


def test_categories_learn_separately():
    rng = np.random.default_rng(2)
    cats = np.repeat([0, 1], 300)
    correct = np.zeros((600, 2))
    correct[:300, 0] = rng.random(300) < 0.9  # task 0 needs the long prompt
    correct[300:, 1] = rng.random(300) < 0.9  # task 1 does fine trimmed
    cost = np.tile([500.0, 100.0], (600, 1))
    out = ucb_per_category(cats, correct, cost, lam=2e-4, n_orders=3, seed=0)
    assert out.correct[:300].mean() > 0.75 and out.correct[300:].mean() > 0.75


def test_oracle_dominates_every_fixed_level():
    rng = np.random.default_rng(3)
    _, correct, cost = _matrix(rng, 50, [0.5, 0.4, 0.3], [300, 150, 60])
    best = oracle(correct, cost, lam=2e-4)
    oracle_reward = (best.correct - 2e-4 * best.tokens).mean()
    for level in range(3):
        assert oracle_reward >= (correct[:, level] - 2e-4 * cost[:, level]).mean()
    assert best.correct.mean() == pytest.approx(correct.max(axis=1).mean())


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
    assert [r["method"] for r in rows] == (["adaptive (UCB per task)"]
                                           + [lv.name for lv in levels] + ["per-item oracle"])
    assert all(r["items"] == 30 for r in rows)
    for row in rows:
        assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]
    oracle_row = rows[-1]
    assert oracle_row["reward"] >= max(r["reward"] for r in rows[1:-1])
    assert summarise(TrimRun(items, levels, correct, tokens, tokens, completed=0)) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"lam": -1.0}, "lam"),
    ({"lam": 1e-3, "n_orders": 0}, "n_orders"),
])
def test_bandit_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ucb_per_category(np.zeros(2), np.zeros((2, 2)), np.ones((2, 2)), **kwargs)
