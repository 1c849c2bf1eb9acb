"""Intervals of proportions stay on [0, 1] and still cover; report tables escape ``|``;
``reproduce`` names the studies it could not run."""

from __future__ import annotations

import numpy as np
import pytest

from canopy.cli import main
from canopy.experiments.outputs import _markdown
from canopy.experiments.study import PROPORTION, UNBOUNDED, Measurement
from canopy.experiments.summary import summarize
from canopy.stats import t_interval, wilson_interval


def test_wilson_covers_a_rare_success_rate_and_stays_in_range():
    rng = np.random.default_rng(0)
    p, n, trials = 0.1, 10, 4000
    covered = 0
    for _ in range(trials):
        data = (rng.random(n) < p).astype(float)
        _, low, high = t_interval(data, bounds=(0.0, 1.0))
        assert 0.0 <= low <= high <= 1.0
        covered += low <= p <= high
    assert covered / trials > 0.92  # nominal 0.95; the plain t-interval covers 0.65 here
    plain = 0
    for _ in range(trials):
        _, low, high = t_interval((rng.random(n) < p).astype(float))
        plain += low <= p <= high
    assert plain < covered


def test_wilson_interval_textbook_value():
    low, high = wilson_interval(1, 10)
    assert low == pytest.approx(0.01788, abs=1e-4) and high == pytest.approx(0.40415, abs=1e-4)


def test_recall_rows_are_bounded_and_regret_rows_are_not():
    values = [0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0, 0.4, 0.0, 0.0]
    ms = [Measurement("m", "budget", 1.0, metric, v * scale, kind)
          for metric, scale, kind in (("recall@5", 1.0, PROPORTION),
                                      ("final regret", -1.0, UNBOUNDED))
          for v in values]
    rows = {row.metric: row for row in summarize(ms)}
    assert rows["recall@5"].ci_low == 0.0 < rows["recall@5"].ci_high < 1.0
    assert rows["final regret"].ci_high > 0.0  # unbounded metric: plain t-interval
    with pytest.raises(ValueError, match="range"):
        t_interval([0.5, 1.5], bounds=(0.0, 1.0))


def test_markdown_cells_escape_the_pipe():
    table = _markdown(["a", "b"], [["x | y", "z"]])
    assert "x \\| y" in table and table.splitlines()[2].count(" | ") == 1


def test_reproduce_without_data_reports_the_studies_it_ran_and_names_the_skipped(
        tmp_path, monkeypatch):
    monkeypatch.setenv("CANOPY_DATA_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("CANOPY_CACHE_DIR", str(tmp_path / "none"))
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--quick", "--study", "theorylink", "--study", "realtopk",
              "--workers", "1", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## theorylink" in report and "## Not run" in report
    assert "| realtopk | open_llm_leaderboard_v1" in report


def test_identical_series_are_marked_and_offset_and_styles_differ():
    from canopy.plotting import distinct_series

    styles = distinct_series(["beam", "se", "uniform"], [[0.5, 0.8], [0.3, 0.4], [0.3, 0.4]])
    assert [s.label for s in styles] == ["beam", "se", "uniform (= se)"]
    assert styles[0].shift == styles[1].shift == 1.0 < styles[2].shift
    assert len({(s.kwargs["marker"], s.kwargs["linestyle"]) for s in styles}) == 3
    with pytest.raises(ValueError, match="names"):
        distinct_series(["a"], [])
