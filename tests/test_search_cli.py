"""``canopy search replay`` end to end through the real command line app."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from canopy.cli import app


def test_replay_json_lists_every_method_and_budget(data_file, tmp_path):
    data_file("qwen25math_rm", "math_cot_100.jsonl")
    plot = tmp_path / "replay.png"
    result = CliRunner().invoke(app, ["search", "replay", "--budgets", "2,8", "--orders", "1",
                                      "--json", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert {(r["method"], r["budget"]) for r in rows} == {
        (m, b) for m in ("first", "majority", "best_of_n", "weighted_vote", "multi_fidelity")
        for b in (2.0, 8.0)}
    for row in rows:
        assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]
        assert row["calls"] <= row["budget"]
    assert plot.stat().st_size > 1000


def test_replay_rejects_a_zero_budget_and_unknown_data(data_file):
    runner = CliRunner()
    result = runner.invoke(app, ["search", "replay", "--dataset", "nope"])
    assert result.exit_code == 2 and "unknown --dataset" in result.output
    data_file("qwen25math_rm", "math_cot_100.jsonl")  # the command reads its data first
    result = runner.invoke(app, ["search", "replay", "--budgets", "0"])
    assert result.exit_code == 2 and "budgets" in result.output
