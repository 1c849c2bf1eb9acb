"""Canopy policies as a Ray Tune searcher, on real Ray Tune: a run whose searcher is saved
after some trials and restored into a new searcher for a second Tuner finishes with the
result of an uninterrupted run (the same trials, the same best configuration)."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from canopy.policies.baselines import SequentialHalving
from canopy.policies.descent import OptimisticDescent
from canopy.tree import Tree

tune = pytest.importorskip("ray.tune", reason="needs the ray extra (Ray Tune)")
ray = pytest.importorskip("ray")

from canopy.integrations.ray_tune import CanopySearcher  # noqa: E402

TREE = Tree.complete(2, 2)
CONFIGS = [{"x": i / 3.0} for i in range(4)]


def objective(config: dict) -> None:
    """A peak at x = 2/3; probes (the cheap fidelity) are noisier."""
    rng = np.random.default_rng(config["canopy_query"])
    noise = 0.2 if config["canopy_fidelity"] == "probe" else 0.05
    tune.report({"loss": (config["x"] - 2.0 / 3.0) ** 2 + noise * rng.standard_normal()})


def _searcher() -> CanopySearcher:
    return CanopySearcher(OptimisticDescent(), TREE, CONFIGS, budget=6.0, probe_cost=0.5,
                          metric="loss", mode="min", sigma=0.1, seed=3)


def _fit(searcher: CanopySearcher, trials: int, path) -> list[tuple]:
    tuner = tune.Tuner(objective, tune_config=tune.TuneConfig(
        search_alg=searcher, num_samples=trials, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(path), verbose=0))
    grid = tuner.fit()
    assert not grid.errors
    return sorted((r.config["canopy_query"], r.config["canopy_fidelity"], r.config["x"],
                   r.metrics["loss"]) for r in grid)


@pytest.fixture(scope="module")
def local_ray():
    paths = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": paths}})
    yield
    ray.shutdown()


def test_a_saved_and_restored_searcher_finishes_as_an_uninterrupted_one(tmp_path, local_ray):
    whole = _searcher()
    trials = _fit(whole, 100, tmp_path / "whole")
    assert whole.policy.ask() is None and 6 <= len(trials) < 100  # the budget ended the run
    first = _searcher()
    before = _fit(first, len(trials) // 2, tmp_path / "first")
    first.save(str(tmp_path / "searcher.pkl"))
    second = _searcher()
    second.restore(str(tmp_path / "searcher.pkl"))
    after = _fit(second, 100, tmp_path / "second")
    assert before + after == trials  # the same trials, configurations and results
    assert second.best_config == whole.best_config
    assert math.isclose(second.policy.spent, whole.policy.spent)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="configs has 3 entries, the tree 4 leaves"):
        CanopySearcher(SequentialHalving(), TREE, CONFIGS[:3], budget=8.0)
    with pytest.raises(ValueError, match="mode must be"):
        CanopySearcher(SequentialHalving(), TREE, CONFIGS, budget=8.0, mode="up")
    with pytest.raises(TypeError, match="canopy Policy"):
        CanopySearcher(object(), TREE, CONFIGS, budget=8.0)
