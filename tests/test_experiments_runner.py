"""The experiment runner: hashing, validation before work, local pool = inline = Ray, a
SIGKILLed run resumes losing and repeating nothing, and the output files, on the toy study of
``tests/toy_study.py`` (a module of its own, so worker processes and child scripts import it
without importing a test file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from canopy.experiments import studies
from canopy.experiments.outputs import StudyOutputs, write_report, write_study
from canopy.experiments.runner import CellStore, cell_key, plan, run_study
from canopy.experiments.study import Measurement
from canopy.stats import t_interval
from toy_study import STUDY


def values(run) -> list[tuple]:
    return [tuple(m) for m in run.measurements]


# ---------------------------------------------------------------------------- summary, keys
def test_t_interval_matches_the_textbook_formula():
    data = [1.0, 2.0, 4.0, 7.0]
    mean, low, high = t_interval(data)
    half = 3.182446305284263 * np.std(data, ddof=1) / 2.0  # t_{0.975, 3}
    assert mean == pytest.approx(3.5)
    assert (low, high) == pytest.approx((3.5 - half, 3.5 + half))
    assert t_interval([5.0]) == (5.0, None, None)
    with pytest.raises(ValueError, match="NaN"):
        t_interval([1.0, float("nan")])


def test_cell_key_is_stable_and_separates_cells_and_seeds():
    cell = {"method": "a", "budget": 1.0}
    assert cell_key("s", cell, 0) == cell_key("s", {"budget": 1.0, "method": "a"}, 0)
    keys = {cell_key("s", cell, 0), cell_key("s", cell, 1), cell_key("t", cell, 0),
            cell_key("s", {"method": "a", "budget": 2.0}, 0)}
    assert len(keys) == 4


# ---------------------------------------------------------------------------- validation
def test_bad_configuration_fails_before_any_work(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown study 'nope'"):
        studies.get_study("nope")
    for seeds in (0, -3):
        with pytest.raises(ValueError, match="seeds must be >= 1"):
            run_study(STUDY, store=tmp_path / "cells", seeds=seeds)
    with pytest.raises(ValueError, match=r"budgets=0.01 is below the cost of one query"):
        run_study(STUDY, store=tmp_path / "cells", overrides={"budgets": "0.01,4"})
    with pytest.raises(ValueError, match="has no parameter 'budget'"):
        run_study(STUDY, store=tmp_path / "cells", overrides={"budget": "4"})
    with pytest.raises(ValueError, match="expected a value like 6"):
        run_study(STUDY, store=tmp_path / "cells", overrides={"depth": "deep"})
    with pytest.raises(ValueError, match="backend must be"):
        run_study(STUDY, store=tmp_path / "cells", backend="slurm")
    assert not (tmp_path / "cells").exists()


# ---------------------------------------------------------------------------- backends
def test_pool_and_inline_agree_and_the_toy_statistics_hold(tmp_path):
    inline = run_study(STUDY, store=tmp_path / "a", workers=1)
    pooled = run_study(STUDY, store=tmp_path / "b", workers=2)
    assert values(inline) == values(pooled)
    assert (inline.computed, inline.reused, inline.n_tasks) == (24, 0, 24)
    again = run_study(STUDY, store=tmp_path / "a", workers=2)
    assert (again.computed, again.reused) == (0, 24) and values(again) == values(inline)
    # probes at 1/20 of the cost: 20x the samples, about sqrt(20) less error
    headline = STUDY.headlines(inline.rows)[0]
    assert headline.passed and headline.ours < 0.6


def test_ray_backend_gives_the_local_numbers(tmp_path):
    pytest.importorskip("ray")
    local = run_study(STUDY, store=tmp_path / "local", seeds=3, workers=1)
    ray_run = run_study(STUDY, store=tmp_path / "ray", seeds=3, backend="ray", workers=2)
    assert ray_run.computed == local.computed == 12
    assert values(ray_run) == values(local)


# ---------------------------------------------------------------------------- resume
_CHILD = """
import sys
sys.path[:0] = {paths!r}
from toy_study import STUDY
from canopy.experiments.runner import run_study
run_study(STUDY, store={store!r}, seeds=8, workers=1,
          overrides={{"sleep": "0.15", "journal": {journal!r}}})
"""


def test_a_killed_run_resumes_losing_and_repeating_nothing(tmp_path):
    store, journal = tmp_path / "cells", tmp_path / "journal.txt"
    code = _CHILD.format(paths=sys.path, store=str(store), journal=str(journal))
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while len(list(store.glob("*.json"))) < 5 and time.monotonic() < deadline:
        assert child.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = {p.name: p.read_bytes() for p in store.glob("*.json")}
    assert 5 <= len(before) < 32
    started_before = len(journal.read_text().split())
    resumed = run_study(STUDY, store=store, seeds=8, workers=1,
                        overrides={"sleep": "0.15", "journal": str(journal)})
    ran_now = journal.read_text().split()[started_before:]
    assert (resumed.reused, resumed.computed) == (len(before), 32 - len(before))
    assert len(ran_now) == len(set(ran_now)) == 32 - len(before)
    assert not {f"{key}.json" for key in ran_now} & set(before)  # nothing finished ran again
    assert all((store / name).read_bytes() == data for name, data in before.items())
    fresh = run_study(STUDY, store=tmp_path / "fresh", seeds=8, workers=1,
                      overrides={"sleep": "0", "journal": ""})
    assert [m.value for m in resumed.measurements] == [m.value for m in fresh.measurements]
    assert not list(store.glob(".*.tmp"))


def test_an_unreadable_cell_file_is_computed_again(tmp_path):
    run = run_study(STUDY, store=tmp_path, seeds=1, workers=1)
    victim = sorted(tmp_path.glob("*.json"))[0]
    victim.write_text("{truncated")
    again = run_study(STUDY, store=tmp_path, seeds=1, workers=1)
    assert (again.computed, again.reused) == (1, 3)
    assert values(again) == values(run)
    assert CellStore(tmp_path).load(plan(STUDY, seeds=1)[2][0]) is not None


@pytest.mark.parametrize("content", ["null", "[]", '{"study": "x"}', "42"])
def test_a_cell_file_holding_valid_json_of_the_wrong_shape_is_computed_again(tmp_path, content):
    run = run_study(STUDY, store=tmp_path, seeds=1, workers=1)
    victim = sorted(tmp_path.glob("*.json"))[0]
    victim.write_text(content)
    again = run_study(STUDY, store=tmp_path, seeds=1, workers=1)
    assert (again.computed, again.reused) == (1, 3)
    assert values(again) == values(run)


# ---------------------------------------------------------------------------- outputs, CLI
def test_outputs_hold_rows_paper_numbers_table_and_figure(tmp_path):
    pytest.importorskip("matplotlib")
    run = run_study(STUDY, store=tmp_path / "toy" / "cells", seeds=3, workers=1)
    paths = write_study(STUDY, run, tmp_path)
    document = json.loads(paths.results.read_text())
    assert {"study", "config", "rows", "paper"} <= set(document)
    assert document["study"] == "toy" and document["config"]["seeds"] == 3
    row = document["rows"][0]
    assert set(row) == {"method", "x_name", "x", "metric", "objective", "mean", "ci_low",
                        "ci_high", "n"}
    assert row["objective"] is None  # a study of one objective
    assert row["n"] == 3 and row["ci_low"] <= row["mean"] <= row["ci_high"]
    assert document["paper"] == [{"method": "probe-root", "x": 8.0, "metric": "abs error",
                                  "value": 0.01}]
    table = paths.table_md.read_text()
    assert "| probe-root | budget | 8 | abs error |" in table and "| 0.01 |" in table
    assert r"\toprule" in paths.table_tex.read_text()
    assert paths.figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = write_report([(STUDY, run, STUDY.headlines(run.rows))], tmp_path, quick=True)
    text = report.read_text()
    assert "probe error / leaf error at budget 8" in text and "toy/figure.png" in text


def test_cli_runs_lists_and_rejects(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from canopy.cli import app

    monkeypatch.setitem(studies.STUDIES, "toy", STUDY.module)
    runner = CliRunner()
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0 and "toy" in listed.output
    done = runner.invoke(app, ["run", "toy", "--quick", "--workers", "1", "--out",
                               str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert StudyOutputs(tmp_path, "toy").results.exists()
    for args, message in ((["run", "nope"], "unknown study"),
                          (["run", "toy", "--seeds", "-1"], "seeds must be >= 1"),
                          (["run", "toy", "--set", "budgets=0.001"], "below the cost"),
                          (["run", "toy", "--backend", "mpi"], "--backend must be")):
        failed = runner.invoke(app, [*args, "--out", str(tmp_path / "bad")])
        assert failed.exit_code == 2 and message in failed.output, failed.output
    failed = runner.invoke(app, ["reproduce", "--study", "toy", "--workers", "0", "--out",
                                 str(tmp_path / "bad")])
    assert failed.exit_code == 2 and "--workers must be >= 1" in failed.output
    assert not (tmp_path / "bad").exists()
    report = runner.invoke(app, ["reproduce", "--quick", "--study", "toy", "--workers", "1",
                                 "--out", str(tmp_path)])
    assert report.exit_code == 0, report.output
    assert (tmp_path / "report.md").exists()



def test_a_second_run_on_a_busy_store_is_refused_and_a_stale_lock_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tmp_path.joinpath(".lock").write_text(str(dead.pid))  # its process is gone: stale
    run = run_study(STUDY, store=tmp_path, seeds=1, workers=1)
    assert run.computed == 4 and not tmp_path.joinpath(".lock").exists()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tmp_path.joinpath(".lock").write_text(str(holder.pid))
        with pytest.raises(ValueError, match=f"in use by another run \\(process {holder.pid}"):
            run_study(STUDY, store=tmp_path, seeds=2, workers=1)
    finally:
        holder.kill()
        holder.wait()


def _children(pid):
    try:
        return {int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()}
    except FileNotFoundError:
        return set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_die_with_a_killed_driver(tmp_path):
    store = tmp_path / "cells"
    code = _CHILD.format(paths=sys.path, store=str(store), journal="").replace(
        "workers=1", "workers=2")
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not list(store.glob("*.json")) and time.monotonic() < deadline:
        assert child.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    workers = _children(child.pid)
    assert len(workers) >= 2
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 20
    while any(os.path.exists(f"/proc/{w}") and
              open(f"/proc/{w}/stat").read().split(")")[-1].split()[0] != "Z"
              for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [w for w in workers if os.path.exists(f"/proc/{w}")
             and open(f"/proc/{w}/stat").read().split(")")[-1].split()[0] != "Z"]
    for w in alive:
        os.kill(w, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their driver"


# ---------------------------------------------------------------------------- integrity
def test_a_tampered_cell_is_detected_recomputed_and_reported(tmp_path):
    run = run_study(STUDY, store=tmp_path, seeds=2, workers=1)
    victim = sorted(tmp_path.glob("*.json"))[0]
    record = json.loads(victim.read_text())
    assert len(record["checksum"]) == 64
    record["measurements"][0][4] = 12345.0  # valid JSON, valid shape, a changed value
    victim.write_text(json.dumps(record))
    stripped = sorted(tmp_path.glob("*.json"))[1]
    record = json.loads(stripped.read_text())
    del record["checksum"]  # a file without its checksum is not trusted either
    stripped.write_text(json.dumps(record))
    again = run_study(STUDY, store=tmp_path, seeds=2, workers=1)
    assert (again.computed, again.reused) == (2, 6)
    assert values(again) == values(run) and again.rows == run.rows
    assert sorted(again.rejected) == sorted(
        [f"{victim.name}: its content does not match its checksum",
         f"{stripped.name}: its content does not match its checksum"])
    assert run_study(STUDY, store=tmp_path, seeds=2, workers=1).rejected == []


def test_cli_reports_a_recomputed_cell(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from canopy.cli import app

    monkeypatch.setitem(studies.STUDIES, "toy", STUDY.module)
    args = ["run", "toy", "--quick", "--workers", "1", "--out", str(tmp_path)]
    assert CliRunner().invoke(app, args).exit_code == 0
    victim = sorted(StudyOutputs(tmp_path, "toy").cells.glob("*.json"))[0]
    victim.write_text(victim.read_text().replace('"abs error", 0.', '"abs error", 1.'))
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0 and "recomputed 1 stored cells that failed their check" in \
        " ".join(done.output.split()), done.output


# ---------------------------------------------------------------------------- users' studies
def test_a_study_by_module_reference_runs_in_workers_and_on_the_cli(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from canopy.cli import app
    from canopy.experiments.runner import load_study

    tmp_path.joinpath("my_studies.py").write_text(
        "import dataclasses\nfrom toy_study import STUDY\n"
        "MINE = dataclasses.replace(STUDY, name='mine', module=__name__)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    study = load_study("my_studies:MINE")
    assert study.name == "mine" and study.module == "my_studies:MINE"
    pooled = run_study("my_studies:MINE", store=tmp_path / "a", seeds=2, workers=2)
    inline = run_study(STUDY, store=tmp_path / "b", seeds=2, workers=1)
    assert values(pooled) == values(inline)
    done = CliRunner().invoke(app, ["run", "my_studies:MINE", "--quick", "--workers", "2",
                                    "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    assert StudyOutputs(tmp_path / "out", "mine").results.exists()
    for reference, message in (("my_studies:NOPE", "is NoneType, not a Study"),
                               ("no_such_module:X", "cannot import 'no_such_module'"),
                               ("my_studies:", "expected package.module:NAME")):
        failed = CliRunner().invoke(app, ["run", reference, "--out", str(tmp_path / "bad")])
        assert failed.exit_code == 2 and message in " ".join(failed.output.split())


_SCRIPT = """
import sys
sys.path[:0] = {paths!r}
from toy_study import STUDY
from canopy.experiments.runner import run_study
{guard}run_study(STUDY, store={store!r}, seeds=2, workers=2)
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_an_unguarded_script_gets_one_clear_error(tmp_path, guarded):
    script = tmp_path / "my_run.py"
    script.write_text(_SCRIPT.format(paths=sys.path, store=str(tmp_path / "cells"),
                                     guard="if __name__ == '__main__':\n    " if guarded
                                     else ""))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    if guarded:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("RuntimeError: ") and "if __name__ ==" in last, done.stderr
        assert "in use by another run" not in done.stderr


# ---------------------------------------------------------------------------- metric kinds
def test_the_declared_kind_chooses_the_interval_never_the_name():
    from canopy.experiments.study import PROPORTION, bounded
    from canopy.experiments.summary import summarize

    data = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    rows = {r.metric: r for r in summarize(
        [Measurement("m", "x", 1.0, "top1", v, PROPORTION) for v in data]
        + [Measurement("m", "x", 1.0, "recall", v - 0.5) for v in data]  # undeclared
        + [Measurement("m", "x", 1.0, "score", 5.0 * v, bounded(0.0, 5.0)) for v in data])}
    assert 0.0 < rows["top1"].ci_low < rows["top1"].ci_high < 1.0  # Wilson on successes
    assert rows["recall"].ci_low < -0.5  # the name "recall" no longer clips anything
    assert rows["score"].ci_low >= 0.0 and rows["score"].ci_high <= 5.0
    with pytest.raises(ValueError, match="declared both"):
        summarize([Measurement("m", "x", 1.0, "a", 0.5, PROPORTION),
                   Measurement("m", "x", 2.0, "a", 0.5)])
    with pytest.raises(ValueError, match="metric kind must be"):
        summarize([Measurement("m", "x", 1.0, "a", 0.5, "fraction")] * 2)
