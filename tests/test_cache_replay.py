"""Replay metrics, scenarios, the TTFT model, the CLI, and Canopy against LRU/LFU on real data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from canopy.apps.cache import (
    Canopy,
    TTFTModel,
    from_paths,
    load_mooncake,
    recovery_curve,
    replay,
    scenario,
    sweep,
)


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
    with pytest.raises(ValueError, match="half_life"):
        Canopy(half_life=0.0)


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
    result = json.loads(out.output)
    cell = result["results"]["canopy"]["8"]
    assert set(cell) >= {"blocks_reused_per_request", "hit_ratio", "ttft_saved_ms",
                         "block_refs_per_s", "recovery"}
    optimal = result["results"]["optimal"]["8"]["blocks_reused_per_request"]
    assert optimal == pytest.approx((0 + 1 + 1 + 27 * 2) / 30)
    assert (tmp_path / "f.png").stat().st_size > 0
    bad = CliRunner().invoke(app, ["cache", "replay", "--trace", str(file), "--capacity", "x"])
    assert bad.exit_code != 0 and "--capacity" in bad.output


def test_canopy_beats_lru_and_lfu_after_a_shift_on_synthetic(data_file):
    """After a popularity shift Canopy must beat the stale LFU and the engine-default LRU
    (blocks reused per request, synthetic trace, 1,024 blocks)."""
    trace = load_mooncake(data_file("mooncake", "synthetic_trace.jsonl"))
    by = {r.policy: r.blocks_reused_per_request
          for r in sweep(trace, policies=["lru", "lfu", "canopy"], capacities=[1024],
                         scenario_name="shift")}
    assert by["canopy"] > 1.03 * by["lru"]
    assert by["canopy"] > 2.0 * by["lfu"]


def test_canopy_beats_lru_and_lfu_on_conversation_at_4096(data_file):
    trace = load_mooncake(data_file("mooncake", "conversation_trace.jsonl"))
    by = {r.policy: r.blocks_reused_per_request
          for r in sweep(trace, policies=["lru", "lfu", "canopy"], capacities=[4096])}
    assert by["canopy"] > 1.05 * max(by["lru"], by["lfu"])
