"""MMLU trimming: the task's prompts, items and grading from the data mirror, its trim levels,
the bandit's lambda trade-off where every level is at chance (the regime of a small model on
MMLU), the study on stored outcomes, the CLI's checks, and a live run against the SmolLM2-135M
llama.cpp server on loopback."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from canopy.apps.trim.bandit import category_oracle, regional_bandit, trim_outcomes
from canopy.apps.trim.benchmarks import load_benchmark
from canopy.apps.trim.run import collect
from canopy.apps.trim.trimmers import approx_tokens, render_query
from canopy.cli import app
from canopy.llm import LLMClient
from canopy.tasks.bbh import Item
from canopy.tasks.mmlu import format_question, grade, header, load_subject, subjects

SUBJECTS = ("abstract_algebra", "world_religions")


@pytest.fixture
def mmlu(data_file, monkeypatch):
    folder = data_file("mmlu", "dev/abstract_algebra_dev.csv").parent.parent
    monkeypatch.setenv("CANOPY_DATA_DIR", str(folder.parent))
    return folder


def test_subject_prompt_is_five_dev_shots_and_items_are_test_questions(mmlu):
    assert len(subjects(mmlu)) == 57 and "anatomy" in subjects(mmlu)
    prompt, items = load_subject(mmlu, "abstract_algebra", n=4, offset=1)
    assert prompt.instruction == header("abstract_algebra") == (
        "The following are multiple choice questions (with answers) about abstract algebra.")
    assert len(prompt.shots) == 5 and all(not s.rationale for s in prompt.shots)
    # the mirror's first dev row: "Find all c in Z_3 ...", choices 0-3, answer 1 -> (B)
    first = prompt.shots[0]
    assert first.question.startswith("Find all c in Z_3") and first.answer == "(B)"
    assert first.question.endswith("Options:\n(A) 0\n(B) 1\n(C) 2\n(D) 3")
    assert first.render(rationale=False).endswith("A: So the answer is (B).")
    everything = load_subject(mmlu, "abstract_algebra")[1]
    assert len(everything) == 100 and items == everything[1:5]
    assert all(item.task == "abstract_algebra" and item.target in {"(A)", "(B)", "(C)", "(D)"}
               for item in everything)
    assert len(load_subject(mmlu, "anatomy", n=2, shots=2)[0].shots) == 2


def test_bad_subjects_and_files_are_clear_errors(mmlu, tmp_path):
    with pytest.raises(ValueError, match="unknown MMLU subject 'astrology'; known: "
                                         "abstract_algebra, anatomy"):
        load_subject(mmlu, "astrology")
    with pytest.raises(ValueError, match="shots must be 0-5"):
        load_subject(mmlu, "anatomy", shots=6)
    for split in ("dev", "test"):
        (tmp_path / split).mkdir()
        (tmp_path / split / f"x_{split}.csv").write_text(
            "question,choice0,choice1,choice2,choice3,answer\nq,a,b,c,d,4\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x_dev\.csv is not an MMLU split file: line 2: "
                                         r"answer '4' is not 0-3"):
        load_subject(tmp_path, "x")
    with pytest.raises(ValueError, match="4 choices, got 3"):
        format_question("q", ["a", "b", "c"])


def test_grading_reads_the_letter_only():
    item = Item("s", "q", "(B)")
    for good in (" So the answer is (B).", " (B) 8", "B", " B.", "B) eight", "the answer is B"):
        assert grade(good, item), good
    for bad in (" So the answer is (C).", " A cat is B", " 8", "", " Both", " (b)"):
        assert not grade(bad, item), bad


def test_mmlu_levels_shrink_and_meet_their_budgets(mmlu):
    loaded = load_benchmark("mmlu", SUBJECTS, n=20, budget_tokens=150)
    names = [level.name for level in loaded.levels]
    assert names == ["full", "shots3", "shots1", "shots0", "keep_first150", "keep_last150",
                     "bm25_150"]
    for prompt, items in loaded.tasks.values():
        for item in items:
            size = {}
            for level in loaded.levels:
                query = render_query(level.build(prompt, item.question), item.question)
                assert query.endswith(f"Q: {item.question}\nA:")
                size[level.name] = approx_tokens(query)
                if level.requested_tokens is not None:
                    assert size[level.name] <= level.requested_tokens, (level.name, item)
            assert size["full"] > size["shots3"] > size["shots1"] > size["shots0"]
        # BM25 keeps whole worked examples; the instruction always stays
        kept = loaded.levels[-1].build(prompt, items[0].question)
        assert kept.startswith(prompt.instruction)
        assert kept.count("So the answer is") == sum(
            s.render(rationale=False) in kept for s in prompt.shots)
    with pytest.raises(ValueError, match="unknown trimming benchmark 'longbench'"):
        load_benchmark("longbench", n=1)


def _chance_outcomes(mmlu, seed: int, n: int = 30):
    """Every level right with probability 0.25 whatever its prompt (a model at chance), input
    tokens the chars/4 estimate of the real MMLU prompts of four subjects."""
    loaded = load_benchmark("mmlu", ("abstract_algebra", "anatomy", "conceptual_physics",
                                     "world_religions"), n=n)
    cats, tokens = [], []
    for subject, (prompt, items) in loaded.tasks.items():
        for item in items:
            cats.append(subject)
            tokens.append([approx_tokens(render_query(level.build(prompt, item.question),
                                                      item.question))
                           for level in loaded.levels])
    tokens = np.asarray(tokens, float)
    correct = (np.random.default_rng(seed).random(tokens.shape) < 0.25).astype(float)
    return trim_outcomes(cats, correct, tokens, levels=[lv.name for lv in loaded.levels])


def test_at_chance_the_bandit_learns_to_serve_the_cheapest_level(mmlu):
    """With no accuracy to gain, lambda decides. At lambda = 0 nothing separates the levels
    and the bandit spreads its plays; as lambda grows it serves fewer tokens, and at 0.02
    (zero-shot's reward 0.9 above the 5-shot prompt's, 0.9 above one shot's) nearly every item
    gets the cheapest level. Between them (5e-3: one shot only 0.2 behind, about the accuracy
    noise of 30 items per subject) it splits between the two cheapest."""
    for seed in (0, 1):
        outcomes = _chance_outcomes(mmlu, seed=seed)
        spent = outcomes.cost.mean(axis=0)
        cheapest = int(np.argmin(spent))
        assert outcomes.models[cheapest] == "shots0"
        shares, tokens = {}, {}
        for lam in (0.0, 1e-3, 5e-3, 2e-2):
            out = regional_bandit(outcomes, lam=lam, n_orders=10, seed=1)
            shares[lam], tokens[lam] = out.choice_share[cheapest], out.tokens.mean()
        assert shares[0.0] < 0.4 and shares[2e-2] > 0.85
        assert tokens[0.0] > tokens[5e-3] > tokens[2e-2] and tokens[2e-2] < 1.2 * spent.min()
        # the per-subject oracle picks the cheapest level everywhere once lambda dominates
        chosen = category_oracle(outcomes, lam=2e-2)
        np.testing.assert_array_equal(chosen.tokens, outcomes.cost[:, cheapest])


def _store(tmp_path, monkeypatch, params, outcomes):
    from canopy.experiments.studies import mmlutrim

    monkeypatch.setenv("CANOPY_CACHE_DIR", str(tmp_path))
    collection = mmlutrim._collection(params)
    key = json.dumps(collection, sort_keys=True)
    digest = __import__("hashlib").sha256(key.encode()).hexdigest()[:16]
    folder = tmp_path / "trim-mmlu"
    folder.mkdir()
    (folder / f"outcomes-{digest}.json").write_text(json.dumps({
        "collection": collection, "subjects": list(outcomes.regions),
        "levels": list(outcomes.models), "correct": outcomes.quality.tolist(),
        "tokens": outcomes.cost.tolist()}), encoding="utf-8")
    mmlutrim._outcomes.cache_clear()


def test_study_on_stored_outcomes_reports_the_trade_off(mmlu, tmp_path, monkeypatch):
    from canopy.experiments.runner import run_study
    from canopy.experiments.studies import ON_REQUEST, get_study
    from canopy.experiments.studies.mmlutrim import MMLUTrimParams, collected_outcomes

    study = get_study("mmlutrim")
    assert "mmlutrim" in ON_REQUEST  # a live model: `canopy reproduce` runs it only on request
    params = MMLUTrimParams(n=30, lams="0,0.02")
    outcomes = _chance_outcomes(mmlu, seed=2)
    _store(tmp_path, monkeypatch, params, outcomes)
    subjects_, levels, correct, _ = collected_outcomes(params)
    assert levels[0] == "full" and len(subjects_) == correct.shape[0] == 120
    result = run_study(study, store=tmp_path / "cells", seeds=6, workers=1,
                       overrides={"n": "30", "lams": "0,0.02"})
    rows = result.rows
    share = {r.x: r for r in rows if r.metric == "cheapest-level share"}
    assert share[0.02].mean > 0.85 and share[0.02].ci_low > share[0.0].ci_high
    full = next(r for r in rows if r.method == "full" and r.metric == "input tokens")
    adaptive = next(r for r in rows if r.method.startswith("adaptive") and r.x == 0.02
                    and r.metric == "input tokens")
    assert adaptive.mean < 0.5 * full.mean
    labels = {h.label: h for h in study.headlines(rows)}
    assert labels["lambda 0.02: share of items served the cheapest level"].ours > 0.85
    with pytest.raises(ValueError, match="lams must be finite numbers >= 0"):
        MMLUTrimParams(lams="-1")


def test_mmlutrim_study_names_a_failing_endpoint_in_one_line(mmlu, scripted_server, tmp_path,
                                                             monkeypatch):
    """An endpoint that fails while the outcomes are collected is a one-line error (the CLI
    prints it and exits 2), and nothing is stored."""
    from canopy.experiments.runner import run_study

    monkeypatch.setenv("CANOPY_CACHE_DIR", str(tmp_path / "cache"))
    scripted_server.routes["/v1/completions"] = lambda n: (500, b"down", 0.0)
    with pytest.raises(ValueError, match=r"collecting MMLU trimming outcomes failed: .*500"):
        run_study("mmlutrim", store=tmp_path / "cells", seeds=1, workers=1,
                  overrides={"n": "2", "base_url": scripted_server.url("/v1"), "model": "m"})
    assert not list((tmp_path / "cells").glob("*.json"))
    assert not list((tmp_path / "cache").rglob("outcomes-*.json"))


def test_cli_rejects_an_unknown_benchmark_or_subject_before_any_call(mmlu):
    runner = CliRunner()
    result = runner.invoke(app, ["trim", "run", "--task", "longbench"])
    assert result.exit_code == 2 and "--task must be one of bbh, mmlu" in result.output
    result = runner.invoke(app, ["trim", "run", "--task", "mmlu", "--tasks", "astrology"])
    assert result.exit_code == 2 and "unknown MMLU subject 'astrology'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.live
def test_live_mmlu_trimming_on_loopback(llm_server, mmlu, tmp_path):
    """Six questions of two subjects, three levels, on the real server: the server's token
    counts follow the levels, and at lambda = 5e-3 (where accuracy at chance cannot pay for
    the shots) the bandit serves the zero-shot prompt to most items."""
    loaded = load_benchmark("mmlu", SUBJECTS, n=6)
    levels = [lv for lv in loaded.levels if lv.name in ("full", "shots1", "shots0")]
    with LLMClient(llm_server.base_url, model=llm_server.model, api_key_env=None,
                   cache_dir=tmp_path, timeout=300.0) as client:
        run = collect(client, loaded.tasks, levels, max_tokens=8, grader=loaded.grader)
    assert run.error is None and run.completed == 12
    full, one, zero = run.tokens.mean(axis=0)
    assert full > one > zero
    assert np.all(np.abs(run.estimated / run.tokens - 1) < 0.5)
    assert set(np.unique(run.correct)) <= {0.0, 1.0}
    outcomes = trim_outcomes([item.task for item in run.items], run.correct, run.tokens,
                             levels=[lv.name for lv in levels])
    out = regional_bandit(outcomes, lam=5e-3, n_orders=20, seed=0)
    assert out.choice_share[2] > 0.6
    assert out.tokens.mean() < 0.6 * full
