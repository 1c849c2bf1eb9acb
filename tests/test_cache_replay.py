"""Replay metrics, scenarios, the TTFT model, the CLI, and Canopy against LRU/LFU on real data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from canopy.apps.cache import (
    LRU,
    Canopy,
    RadixCache,
    TTFTModel,
    from_paths,
    load_mooncake,
    load_prompt_log,
    recovery_curve,
    replay,
    scenario,
    sweep,
)
from canopy.prefix import StreamingCache


def test_metrics_on_a_hand_checked_trace():
    trace = from_paths([[1, 2, 3], [1, 2, 4], [1, 2, 3]], block_size=10,
                       input_tokens=[30, 25, 30])
    result = replay(trace, "lru", 8, ttft=TTFTModel(ms_per_token=1.0))
    assert result.reused.tolist() == [0, 2, 3]
    assert result.blocks_reused_per_request == pytest.approx(5 / 3)
    assert result.hit_ratio == pytest.approx(5 / 9)
    assert result.ttft_saved_ms == pytest.approx((0 + 20 + 30) / 3)
    assert result.block_refs_per_s > 0


def test_ttft_model_is_linear_and_validated():
    model = TTFTModel(ms_per_token=0.5, overhead_ms=10.0)
    assert model.ttft_ms(np.array([0, 100])).tolist() == [10.0, 60.0]
    assert model.saved_ms(np.array([100])).tolist() == [50.0]
    with pytest.raises(ValueError, match="ms_per_token"):
        TTFTModel(ms_per_token=-1.0)
    with pytest.raises(ValueError, match="half_lives"):
        Canopy(half_lives=(0.0,))
    with pytest.raises(ValueError, match="start_half_life"):
        Canopy(start_half_life=3.0)
    with pytest.raises(ValueError, match="seed"):
        Canopy(seed=-1)
    with pytest.raises(ValueError, match="candidates"):
        Canopy(candidates=0)


@pytest.mark.parametrize("make", [
    lambda: TTFTModel(ms_per_token="0.1"), lambda: Canopy(seed=1.5),
    lambda: Canopy(candidates=32.0),
    lambda: Canopy(half_lives=(True,)), lambda: Canopy(z=None),
    lambda: RadixCache(from_paths([[1]]), LRU(), 2.0),
    lambda: StreamingCache("lru", 4, history_floor="0.5"),
    lambda: load_prompt_log("unused.jsonl", block_size=16.0)])
def test_a_value_of_the_wrong_kind_is_a_type_error(make):
    with pytest.raises(TypeError):
        make()


def test_shift_counts_only_after_the_shift():
    trace = from_paths([[1, 2], [1, 2], [1, 3]])
    joined, start = scenario(trace, "shift")
    result = replay(joined, "lru", 16, start=start)
    assert result.reused.tolist() == [0, 2, 1]  # nothing carries over the shift
    assert recovery_curve(result, window=1).tolist() == [0.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="scenario"):
        scenario(trace, "drift")


def test_cli_replay_json_and_plot(tmp_path):
    from canopy.cli import app
    file = tmp_path / "t.jsonl"
    rows = [{"timestamp": i, "input_length": 1024, "hash_ids": [0, i % 3 + 1]} for i in range(30)]
    file.write_text("\n".join(json.dumps(r) for r in rows))
    out = CliRunner().invoke(app, ["cache", "replay", "--trace", str(file), "--capacity", "2,8",
                                   "--policies", "lru,canopy,optimal", "--scenario", "shift",
                                   "--window", "10", "--json", "--plot", str(tmp_path / "f.png")])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert f"plot written to {tmp_path / 'f.png'}" in out.stderr
    cell = result["results"]["canopy"]["8"]
    assert set(cell) >= {"blocks_reused_per_request", "hit_ratio", "ttft_saved_ms",
                         "block_refs_per_s", "wall_block_refs_per_s", "recovery"}
    optimal = result["results"]["optimal"]["8"]["blocks_reused_per_request"]
    assert optimal == pytest.approx((0 + 1 + 1 + 27 * 2) / 30)
    assert (tmp_path / "f.png").stat().st_size > 0
    bad = CliRunner().invoke(app, ["cache", "replay", "--trace", str(file), "--capacity", "x"])
    assert bad.exit_code != 0 and "--capacity" in bad.output
    bad = CliRunner().invoke(app, ["cache", "replay", "--trace", str(file), "--seed", "-1"])
    assert bad.exit_code != 0 and "seed" in bad.output


CAPACITIES = [16, 64, 256, 1024, 4096]


@pytest.mark.parametrize("scenario_name", ["stationary", "shift"])
@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_canopy_reuses_at_least_max_of_lru_and_lfu(data_file, name, scenario_name):
    """The issue's claim, cell by cell: blocks reused per request of ``canopy`` >= the better
    of ``lru`` and ``lfu``, exactly (no tolerance), with the default sample seed
    (docs/cache.md reports seeds 0-4)."""
    trace = load_mooncake(data_file("mooncake", f"{name}_trace.jsonl"))
    results = sweep(trace, policies=["lru", "lfu", "canopy"], capacities=CAPACITIES,
                    scenario_name=scenario_name)
    by = {(r.policy, r.capacity): r.blocks_reused_per_request for r in results}
    for capacity in CAPACITIES:
        assert by["canopy", capacity] >= max(by["lru", capacity], by["lfu", capacity]), capacity


@pytest.mark.parametrize("seed", [1, 2])
def test_canopy_beats_lru_and_lfu_with_other_sample_seeds(data_file, seed):
    """The sampled capacities do not hinge on one hash seed: the cells where the sample
    decides (1,024 blocks, where the conversation trace wants long memory and the synthetic
    one recency) hold with other seeds too."""
    for name in ("conversation", "synthetic"):
        trace = load_mooncake(data_file("mooncake", f"{name}_trace.jsonl"))
        by = {p: replay(trace, p, 1024).blocks_reused_per_request for p in ("lru", "lfu")}
        canopy = replay(trace, Canopy(seed=seed), 1024).blocks_reused_per_request
        assert canopy >= max(by.values()), name


def test_canopy_learns_how_much_to_remember(data_file):
    """The arm it settles on follows the workload: long memory on the conversation trace at
    1,024 blocks (where LFU beats LRU), recency, where it started, on the synthetic trace at
    4,096 (where no decayed arm leads it by 3 standard errors in the shadows)."""
    policy = Canopy()
    conversation = load_mooncake(data_file("mooncake", "conversation_trace.jsonl"))
    cache = RadixCache(conversation, policy, 1024)
    cache.run()
    assert policy.arm_names[cache.arm] == "half-life 32" and cache.switches >= 1
    synthetic = load_mooncake(data_file("mooncake", "synthetic_trace.jsonl"))
    cache = RadixCache(synthetic, policy, 4096)
    cache.run()
    assert policy.arm_names[cache.arm] == "recency"
