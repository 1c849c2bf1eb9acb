"""Measuring the prior (issue 14 item 3): the analysis on logs whose answer is known, the log
round trip and its errors, the tree expansion, and one short live run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from canopy.apps.search.prior import LogRow, analyse, expand_tree, read_log, write_log


def _tree(rng: np.random.Generator, name: str, informative: bool, branching: int = 3,
          depth: int = 3) -> list[LogRow]:
    """A synthetic tree: node truth in [0, 1]; the probe equals it (informative) or is
    independent noise."""
    rows, frontier, next_id = [], [(0, None, 0.5)], 1
    for level in range(depth + 1):
        grown = []
        for node, parent, truth in frontier:
            probe = truth if informative else float(rng.random())
            rows.append(LogRow(name, node, parent, level, probe, truth))
            if level < depth:
                for _ in range(branching):
                    grown.append((next_id, node, float(np.clip(truth + rng.normal(0, 0.3),
                                                               0, 1))))
                    next_id += 1
        frontier = grown
    return rows


def test_a_perfect_probe_follows_every_edge():
    rng = np.random.default_rng(0)
    rows = [row for t in range(5) for row in _tree(rng, f"t{t}", True)]
    result = analyse(rows)
    assert result["spearman"] == pytest.approx(1.0) and result["pearson"] == pytest.approx(1.0)
    assert result["hit_rate"] == 1.0 and result["value_lost_per_step"] == 0.0
    assert result["steps"] == 5 * (1 + 3 + 9)
    assert result["pivotal"]["0.25"]["hit_rate"] == 1.0


def test_an_uninformative_probe_hits_at_chance():
    rng = np.random.default_rng(1)
    rows = [row for t in range(60) for row in _tree(rng, f"t{t}", False)]
    result = analyse(rows)
    assert abs(result["spearman"]) < 0.1
    assert 1 / 3 <= result["hit_rate_chance"] < 0.45  # 3 children; clipped ties add best ones
    assert abs(result["hit_rate"] - result["hit_rate_chance"]) < 0.06  # 780 steps
    assert result["value_lost_per_step"] > 0.1
    fractions = [result["pivotal"][tau]["fraction"] for tau in ("0.25", "0.5", "0.75")]
    assert fractions == sorted(fractions, reverse=True) and fractions[0] > fractions[2]


def test_node_values_are_means_of_their_rollouts():
    rows = [LogRow("q", 0, None, 0, 0.2, 0.0), LogRow("q", 1, 0, 1, 0.9, 1.0),
            LogRow("q", 1, 0, 1, 0.7, 0.0), LogRow("q", 2, 0, 1, 0.1, 1.0),
            LogRow("q", 2, 0, 1, 0.1, 1.0)]
    result = analyse(rows)  # child 1: probe 0.8, truth 0.5; child 2: probe 0.1, truth 1.0
    assert result["steps"] == 1 and result["hit_rate"] == 0.0
    assert result["value_lost_per_step"] == pytest.approx(0.5)
    assert result["pivotal"]["0.5"]["fraction"] == 1.0
    assert result["pivotal"]["0.75"]["fraction"] == 0.0


def test_the_log_round_trips_and_bad_lines_are_named(tmp_path):
    rows = _tree(np.random.default_rng(2), "t", True, branching=2, depth=2)
    path = tmp_path / "prior.jsonl"
    write_log(rows, path)
    assert read_log(path) == rows
    path.write_text(json.dumps({"tree": "t", "node": 0}) + "\n")
    with pytest.raises(ValueError, match=r"prior\.jsonl:1: not a prior-log row"):
        read_log(path)
    path.write_text(json.dumps({"tree": "t", "node": 0, "parent": None, "depth": 0,
                                "probe": float("nan"), "truth": 1}) + "\n")
    with pytest.raises(ValueError, match="finite"):
        read_log(path)


def test_expand_tree_logs_every_node_with_distinct_children():
    calls = {"rollout": 0}

    def rollout(prefix: str, seed: int) -> tuple[float, float]:
        calls["rollout"] += 1
        return len(prefix) / 100, float(prefix.count("a"))

    def step(prefix: str, seed: int) -> str | None:
        return "ab"[seed % 2] * (1 + seed % 3)

    rows = expand_tree("q", rollout, step, branching=2, depth=2, rollouts=2)
    nodes = {row.node for row in rows}
    assert len(nodes) == 1 + 2 + 4 and calls["rollout"] == 2 * 7
    depths = {row.node: row.depth for row in rows}
    assert sorted(depths.values()).count(2) == 4
    with pytest.raises(ValueError, match="branching"):
        expand_tree("q", rollout, step, branching=0)


def test_canonical_programs_pass_and_broken_ones_fail(data_file):
    data_file("mbpp", "mbpp.jsonl")
    data_file("humaneval", "HumanEval.jsonl.gz")
    from canopy.apps.search.code import load_code_tasks, pass_rate, program

    for dataset in ("humaneval", "mbpp"):
        for task in load_code_tasks(dataset, n=3):
            good = program(task, task.canonical) if dataset == "humaneval" else \
                task.prompt + task.canonical + "\n"
            assert pass_rate(good, task.tests) == 1.0 and pass_rate(good, task.probe_tests) \
                == 1.0, task.task_id
            broken = task.prompt + ("    return None\n" if dataset == "humaneval" else
                                    "def nothing():\n    pass\n")
            assert pass_rate(broken, task.tests) == 0.0


def test_a_short_live_prior_run(tmp_path, llm_server, data_file):
    data_file("mbpp", "mbpp.jsonl")
    from canopy.apps.search.prior import log_prior, prior_items
    from canopy.llm import LLMClient

    client = LLMClient(llm_server.base_url, model=llm_server.model, api_key_env=None,
                       timeout=120.0, cache_dir=tmp_path / "cache")
    rows = log_prior(client, "mbpp", prior_items("mbpp", n=1), branching=2, depth=1,
                     rollouts=1, max_tokens=48)
    client.close()
    assert {row.depth for row in rows} <= {0, 1} and len({row.node for row in rows}) >= 2
    assert all(0 <= row.probe <= 1 and 0 <= row.truth <= 1 for row in rows)
    write_log(rows, tmp_path / "log.jsonl")
    assert analyse(read_log(tmp_path / "log.jsonl"))["nodes"] == len({r.node for r in rows})


def test_bbh_items_come_with_their_few_shot_prompt(data_file):
    data_file("bbh", "bbh/navigate.json")
    from canopy.apps.search.prior import prior_items
    from canopy.tasks.bbh import cot_prompt

    items = prior_items("bbh:navigate", n=2, offset=1)
    assert len(items) == 2
    fewshot, item = items[0]
    prompt = cot_prompt(fewshot, item.question)
    assert prompt.count("Q: ") == len(fewshot.shots) + 1 and prompt.endswith("step by step.\n")
    with pytest.raises(ValueError, match="unknown BBH task"):
        prior_items("bbh:no_such_task", n=1)
