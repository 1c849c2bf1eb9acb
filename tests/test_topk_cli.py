"""``canopy topk`` on users' CSVs: the JSON answer and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from canopy.apps.topk.cli import register


@pytest.fixture(scope="module")
def app():
    application = typer.Typer()
    register(application)

    @application.command("noop", hidden=True)
    def _noop() -> None:  # a second command keeps typer from flattening the app
        return None

    return application


def pool_csv(tmp_path, n=60, seed=0):
    """A pool of ``n`` candidates in 6 families; the family sets most of the target."""
    rng = np.random.default_rng(seed)
    family = np.arange(n) % 6
    level = 20 + 10 * family
    lines = ["name,family,target,other_a,other_b"]
    for i in range(n):
        lines.append(f"model-{i},fam{family[i]},{level[i] + rng.uniform(0, 5):.2f},"
                     f"{level[i] + rng.uniform(0, 3):.2f},{rng.uniform(0, 100):.2f}")
    path = tmp_path / "pool.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("tree", [[], ["--tree-from", "other_a"], ["--families", "family"]])
@pytest.mark.parametrize("method", ["canopy", "canopy-edge", "successive-elimination", "uniform",
                                    "sequential-halving"])
def test_json_answer_stays_within_budget(app, tmp_path, method, tree):
    path = pool_csv(tmp_path)
    args = ["topk", "--pool", str(path), "--target", "target", "--k", "5", "--budget", "40",
            "--method", method, "--branching", "3", "--depth", "2", "--seed", "4", "--json",
            *tree]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert len(answer["names"]) == 5 == len(set(answer["names"]))
    assert all(name.startswith("model-") for name in answer["names"])
    assert answer["spent"] <= 40.0 + 1e-9
    assert answer["spent"] == pytest.approx(answer["n_probes"] * 0.05 + answer["n_leaf_evals"])
    again = CliRunner().invoke(app, args)
    assert json.loads(again.stdout) == answer  # same seed, same answer


def test_table_output(app, tmp_path):
    result = CliRunner().invoke(app, ["topk", "--pool", str(pool_csv(tmp_path)), "--target",
                                      "target", "--k", "3", "--budget", "30", "--method",
                                      "uniform"])
    assert result.exit_code == 0, result.output
    assert "spent" in result.stdout and "leaf evaluations" in result.stdout


@pytest.mark.parametrize(("extra", "message"), [
    (["--target", "missing"], "no target column 'missing'"),
    (["--target", "target", "--k", "61"], "k must be in 1..60"),
    (["--target", "target", "--method", "greedy"], "unknown --method 'greedy'"),
    (["--target", "target", "--tree-from", "other_a", "--families", "family"], "not both"),
    (["--target", "target", "--tree-from", "nope"], "no feature column 'nope'"),
    (["--target", "target", "--budget", "0.01"], "budget"),
])
def test_bad_arguments_get_clear_errors(app, tmp_path, extra, message):
    args = ["topk", "--pool", str(pool_csv(tmp_path)), "--budget", "20", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_malformed_csv_gets_a_clear_error(app, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("name,target\na,0.5\nb,0.7,0.1\n")
    result = CliRunner().invoke(app, ["topk", "--pool", str(path), "--target", "target",
                                      "--budget", "10"])
    assert result.exit_code == 2
    assert "row 3: 3 fields" in " ".join(result.output.split())
