"""A newcomer's first hour: the version, help without an empty error, valid names in every
"unknown" error, output paths checked before work, tables that are never cut, plots that hide
no series, progress in a log, and a top-k tree that does not leak the target."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from canopy import __version__
from canopy.apps.routing.logs import read_long
from canopy.apps.routing.replay import replay
from canopy.apps.topk.pools import aggregates_of_target, read_pool_csv
from canopy.apps.topk.select import captured
from canopy.cli import main
from canopy.plotting import distinct_series
from canopy.reporting import progress_lines, render


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_version(capsys):
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and out.strip() == f"canopy {__version__}"


@pytest.mark.parametrize("args", [(), ("route",), ("cache",)])
def test_a_bare_group_prints_its_help_without_an_empty_error(capsys, args):
    code, out, err = _run(capsys, *args)
    assert code == 2 and "Usage" in out + err
    assert "error:" not in err


def test_an_unknown_router_lists_the_valid_names(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"query_id": q, "region": "r", "model": m,
                                       "quality": 0.5, "cost": 0.1}) + "\n"
                           for q in range(3) for m in ("a", "b")))
    with pytest.raises(KeyError, match=r"unknown router 'flatt'; known: .*flat.*regional.*"
                                       r"fixed:a, fixed:b"):
        replay(read_long(log), seeds=1, routers=["flatt"])


@pytest.mark.parametrize("args", [
    ("demo", "--plot", "/nonexistent/x.png"),
    ("cache", "replay", "--plot", "/nonexistent/x.png"),
    ("search", "replay", "--plot", "/"),
    ("route", "replay", "--dataset", "routellm-mmlu", "--plot", "/nonexistent/x.png"),
    ("run", "fidelity", "--quick", "--out", "/dev/null/x"),
])
def test_an_output_path_is_checked_before_any_work(capsys, args):
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and ("does not exist" in err or "cannot write" in err or
                                     "is a folder" in err or "is a file" in err), err


def _pool_csv(tmp_path, rows: int = 60) -> str:
    rng = np.random.default_rng(0)
    target, a, b = (rng.uniform(20, 90, rows).round(1) for _ in range(3))
    average = ((target + a + b) / 3).round(2)
    lines = ["model,Average,target,a,b"] + [
        f"m{i},{average[i]},{target[i]},{a[i]},{b[i]}" for i in range(rows)]
    file = tmp_path / "pool.csv"
    file.write_text("\n".join(lines) + "\n")
    return str(file)


def test_the_default_tree_leaves_out_an_aggregate_of_the_target(tmp_path):
    pool = read_pool_csv(_pool_csv(tmp_path), target="target")
    assert pool.left_out == ("Average",) and pool.feature_names == ("a", "b")
    # an aggregate of the other columns only does not contain the target: kept
    rng = np.random.default_rng(1)
    t, a, b = rng.uniform(size=(3, 80))
    assert aggregates_of_target(t, {"a": a, "b": b, "mean_ab": (a + b) / 2}) == []
    assert aggregates_of_target(t, {"a": a, "b": b, "mean_tab": (t + a + b) / 3}) == ["mean_tab"]


def test_the_cli_says_which_columns_it_left_out(capsys, tmp_path):
    code, out, err = _run(capsys, "topk", "--pool", _pool_csv(tmp_path), "--target",
                          "target", "--budget", "100", "--k", "3", "--json")
    assert code == 0
    assert "left out of the tree (they contain target): Average" in err
    payload = json.loads(out)
    assert payload["left_out"] == ["Average"] and "Average" not in payload["tree"]
    assert 0 <= payload["recall"] <= 1 and np.isfinite(payload["complexity"])


def test_captured_runs_from_a_random_pick_to_the_top_k():
    scores = np.arange(100) / 100
    assert captured(np.arange(90, 100), scores, 10) == pytest.approx(1.0)
    assert captured(np.arange(100)[::10], scores, 10) == pytest.approx(-0.045 / 0.45)
    assert captured(np.array([49, 50]), scores, 2) == pytest.approx(0.0, abs=1e-12)


def test_a_table_too_wide_for_the_terminal_becomes_blocks_not_ellipses():
    label = "sound (certified, composed): fraction of examined cells pruned at budget 1,500"
    rows = [[label, "0.9", "[0.852, 0.948]", "0.62", "1.45", "< successive elimination", "no"]]
    columns = ("headline", "ours", "95% CI", "paper", "ratio", "goal", "met")
    narrow = io.StringIO()
    render(rows, columns, title="t", console=Console(file=narrow, width=80,
                                                      force_terminal=True, color_system=None))
    text = narrow.getvalue()
    assert label in text and "[0.852, 0.948]" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    piped = io.StringIO()
    render(rows, columns, title="t", console=Console(file=piped, width=80))
    assert any(label in line and "[0.852, 0.948]" in line for line in piped.getvalue().splitlines())


def test_series_that_share_a_point_are_set_apart():
    styles = distinct_series(["a", "b", "c"], [[1.0, 2.0], [1.0, 3.0], [5.0, 6.0]],
                             [[1, 2], [1, 2], [1, 2]])
    assert [s.shift for s in styles] == [1.0, 1.015, 1.0]
    assert styles[1].along([1.0], span=10.0) == [pytest.approx(1.15)]
    twins = distinct_series(["a", "b"], [[1.0, 2.0], [1.0, 2.0]])
    assert twins[1].label == "b (= a)" and twins[1].shift > 1


def test_progress_lines_report_the_end_even_when_throttled():
    out = io.StringIO()
    update = progress_lines("work", Console(file=out, width=80))
    for done in range(1, 101):
        update(done, 100)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("work: 1/100") and lines[-1].startswith("work: 100/100")
    assert len(lines) < 100
