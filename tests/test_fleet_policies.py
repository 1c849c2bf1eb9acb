"""Replica policies through the gateway's interface: each peer's rule on views built to
separate it from the others, Canopy's learner, pickling mid-run, bad arguments."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from canopy.fleet import NAMES, Load, ReplicaIndex, Request, View, make_policy
from canopy.fleet import load as load_module
from canopy.fleet.policies import DEFAULT_GRID, LEARNT_GRID

BLOCK = 16


def _view(replicas: int = 4) -> View:
    return View(ReplicaIndex(replicas), Load(replicas, capacity_blocks=1000), 0.0, BLOCK)


def _request(keys, rid: int = 0) -> Request:
    keys = np.asarray(keys, dtype=np.int64)
    return Request(keys, keys.size * BLOCK, rid=rid)


def test_round_robin_and_least_load():
    view = _view()
    rr = make_policy("round_robin")
    assert [rr.choose(_request([1]), view) for _ in range(5)] == [0, 1, 2, 3, 0]
    view.load.table[load_module.INFLIGHT] = [3, 1, 2, 1]
    view.load.table[load_module.QUEUED_TOKENS] = [0, 50, 0, 10]
    assert make_policy("least_load").choose(_request([1]), view) == 3


def test_power_of_two_never_takes_the_busiest_and_is_seeded():
    view = _view(8)
    view.load.table[load_module.INFLIGHT] = np.arange(8)[::-1]  # replica 0 the busiest
    picks = [make_policy("power_of_two", seed=s).choose(_request([1]), view) for s in range(200)]
    assert 0 not in picks and len(set(picks)) >= 6
    again = [make_policy("power_of_two", seed=s).choose(_request([1]), view) for s in range(200)]
    assert picks == again


def test_prefix_hash_is_consistent_and_spreads_prefixes():
    view = _view(8)
    policy = make_policy("prefix_hash")
    chains = [[1, 2, 3, k] for k in range(400)]
    first = [policy.choose(_request(c), view) for c in chains]
    assert first == [policy.choose(_request([*c, 9]), view) for c in chains]  # same 4 blocks
    counts = np.bincount(first, minlength=8)
    assert counts.min() >= 25  # about 50 each


def test_sglang_follows_a_match_above_threshold_unless_imbalanced():
    view = _view()
    view.index.stored(2, [1, 2])
    view.load.table[load_module.INFLIGHT] = [0, 1, 5, 1]
    sglang = make_policy("sglang")
    assert sglang.choose(_request([1, 2, 3, 4, 5]), view) == 2  # match rate 0.4 > 0.3
    assert sglang.choose(_request([1, 2, 3, 4, 5, 6, 7]), view) == 0  # 2/7 < 0.3: least load
    assert make_policy("sglang", cache_threshold=0.5).choose(_request([1, 2, 3, 4, 5]),
                                                             view) == 0
    view.load.table[load_module.INFLIGHT] = [0, 1, 70, 1]  # 70 - 0 > 64 and 70 > 1.5 x 0
    assert sglang.choose(_request([1, 2, 3, 4, 5]), view) == 0


def test_dynamo_weighs_prefill_blocks_against_active_blocks():
    view = _view()
    view.index.stored(1, [1, 2, 3, 4])
    view.load.table[load_module.ACTIVE_BLOCKS] = [0, 3, 10, 10]
    request = _request([1, 2, 3, 4, 5, 6])  # replica 1: 2 to prefill + 3 active; 0: 6 + 0
    assert make_policy("dynamo").choose(request, view) == 1
    assert make_policy("dynamo", dynamo_weight=0.25).choose(request, view) == 0


def test_llmd_scores_prefix_queue_and_kv_use_three_one_one():
    view = _view()
    view.index.stored(3, [1, 2])
    view.load.table[load_module.QUEUED] = [0, 4, 4, 4]
    view.load.table[load_module.KV_USE] = [0.0, 0.5, 0.5, 0.5]
    request = _request([1, 2, 3, 4])  # replica 3: 3 x 0.5 = 1.5 + 0 + 0.5 = 2; replica 0: 2
    request_more = _request([1, 2, 3])  # replica 3: 3 x 2/3 + 0.5 = 2.5 > 2
    assert make_policy("llmd").choose(request_more, view) == 3
    assert make_policy("llmd", llmd_weights=(1, 1, 1)).choose(request, view) == 0


def test_canopy_theta_trades_cached_tokens_against_queued_work():
    view = _view(2)
    view.index.stored(1, [1, 2, 3, 4])
    view.load.table[load_module.QUEUED_TOKENS] = [0, 100]
    view.load.table[load_module.QUEUED] = [0, 1]
    request = _request([1, 2, 3, 4, 5])  # replica 1 saves 64 tokens of prefill, waits 100 + 20
    assert make_policy("canopy", theta=1.0, overhead_tokens=20).choose(request, view) == 0
    assert make_policy("canopy", theta=2.0, overhead_tokens=20).choose(request, view) == 1


def test_canopy_learns_the_trade_off_that_gives_the_lowest_ttft():
    """Feedback that rewards affinity (a low TTFT whenever theta >= 2 was used): the router
    moves its choices to those arms."""
    policy = make_policy("canopy", seed=3)
    view = _view(2)
    rng = np.random.default_rng(0)
    chosen = []
    for rid in range(600):
        request = _request([7, 8, 9, int(rng.integers(10, 14))], rid=rid)
        replica = policy.choose(request, view)
        theta = policy.params[0]
        chosen.append(theta)
        policy.observe(request, replica, 0.2 if theta >= 2 else 1.0)
    assert np.mean(np.asarray(chosen[-200:]) >= 2) > 0.9


def test_canopy_never_learns_a_trade_off_below_one():
    """Below 1 the score weighs prefill less than wait, dominated in the TTFT model: even
    when spreading pays (a low TTFT whenever theta <= 1), the learner stays at theta 1, and
    the fixed references keep their grid of nine."""
    policy = make_policy("canopy", seed=5)
    view = _view(2)
    rng = np.random.default_rng(1)
    chosen = []
    for rid in range(400):
        request = _request([7, 8, 9, int(rng.integers(10, 14))], rid=rid)
        replica = policy.choose(request, view)
        chosen.append(policy.params[0])
        policy.observe(request, replica, 0.2 if policy.params[0] <= 1.0 else 1.0)
    assert min(chosen) == 1.0
    assert np.mean(np.asarray(chosen[-100:]) == 1.0) > 0.9
    assert len(DEFAULT_GRID) >= 8 and set(LEARNT_GRID) == {t for t in DEFAULT_GRID if t >= 1}


def test_policies_pickle_mid_run_and_continue_bit_for_bit():
    view = _view(4)
    view.index.stored(0, [1, 2])
    for name in NAMES:
        policy = make_policy(name, seed=5)
        for rid in range(20):
            request = _request([1, 2, rid], rid=rid)
            policy.observe(request, policy.choose(request, view), 0.1 * (rid % 3))
        twin = pickle.loads(pickle.dumps(policy))
        a = [policy.choose(_request([1, 2, k], rid=100 + k), view) for k in range(30)]
        b = [twin.choose(_request([1, 2, k], rid=100 + k), view) for k in range(30)]
        assert a == b, name


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="unknown replica policy 'nope'"):
        make_policy("nope")
    with pytest.raises(ValueError, match="cache_threshold"):
        make_policy("sglang", cache_threshold=1.5)
    with pytest.raises(TypeError, match="dynamo_weight"):
        make_policy("dynamo", dynamo_weight="1")
    with pytest.raises(ValueError, match="n_replicas"):
        ReplicaIndex(65)
    with pytest.raises(ValueError, match="ttft_s"):
        make_policy("canopy").observe(_request([1]), 0, float("nan"))


def test_a_view_matches_a_request_once_until_the_index_or_the_time_changes(monkeypatch):
    """The policy's choice and the gateway's record of what each replica held read one
    match; whatever changes the index (a send, an event, an expiry, a calibration of the
    TTL) or the time makes the next read match again."""
    view = View(ReplicaIndex(2, mode="approximate", ttl_s=10.0),
                Load(2, capacity_blocks=1000), 0.0, BLOCK)
    matched: list[int] = []
    real = view.index.match

    def counted(keys, now=0.0, out=None):
        matched.append(1)
        return real(keys, now, out)

    monkeypatch.setattr(view.index, "match", counted)
    keys = np.arange(1, 5, dtype=np.int64)
    assert view.matched(keys).tolist() == [0, 0] and view.matched(keys).tolist() == [0, 0]
    assert len(matched) == 1
    view.index.sent(1, keys[:3], 0.0)
    assert view.matched(keys).tolist() == [0, 3] and len(matched) == 2
    view.now = 20.0  # past the TTL
    assert view.matched(keys).tolist() == [0, 0] and len(matched) == 3
    for change in (lambda: view.index.stored(0, keys[:1]), lambda: view.index.removed(0, keys[:1]),
                   lambda: view.index.cleared(1), lambda: view.index.expire(30.0),
                   lambda: view.index.reported(3, 1)):
        before = len(matched)
        change()
        view.matched(keys)
        assert len(matched) == before + 1
    assert view.matched(keys.copy()) is not None and len(matched) == 9  # another request
