"""``canopy demo`` end to end (small), and the bench helpers on tiny horizons."""

import json
import math

from typer.testing import CliRunner

from canopy.bench import certificate_throughput, policy_overhead_us
from canopy.cli import app
from canopy.tree import Tree


def test_demo_prints_a_table_and_writes_a_plot(tmp_path):
    plot = tmp_path / "demo.png"
    result = CliRunner().invoke(app, ["demo", "--seeds", "1", "--budgets", "300",
                                      "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    for method in ("canopy-beam", "canopy-sound", "successive-elimination", "uniform"):
        assert method in result.output
    assert plot.stat().st_size > 1000


def test_demo_rejects_bad_budgets():
    result = CliRunner().invoke(app, ["demo", "--budgets", "300,abc"])
    assert result.exit_code != 0
    assert "budgets" in result.output


def test_bench_helpers_measure_something():
    from canopy.policies import OptimisticDescent

    overhead = policy_overhead_us(OptimisticDescent, Tree.complete(2, 6), 300)
    assert math.isfinite(overhead) and overhead > 0
    figures = certificate_throughput(20_000)
    assert set(figures) == {"batch_probes_per_s", "incremental_batched_probes_per_s",
                            "incremental_single_probes_per_s"}
    assert all(value > 0 for value in figures.values())
    json.dumps(figures)
