"""Per-call routing inside agents (issue 12 item 3): the seeded multi-phase environment, the
learners against each other, and episode feedback through the proxy over real HTTP."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from canopy.apps.routing.agents import (
    AgentResult,
    oracle_policy,
    run_agents,
    summarize_agents,
)

pytest.importorskip("fastapi", reason="the proxy needs the serve extra")

from canopy.apps.routing.proxy.app import create_app, serve_in_thread
from canopy.apps.routing.proxy.config import ProxyConfig


def test_the_oracle_knows_each_phases_best_model():
    policy, value = oracle_policy(5.0)
    assert policy["easy"]["code"] == policy["hard"]["code"] == "coder"
    assert policy["hard"]["plan"] == "large" and policy["easy"]["tool"] == "small"
    assert 0 < value["hard"] < value["easy"] < 1


def test_fraction_intervals_stay_in_zero_one():
    results = [AgentResult("flat", i, u, u, s, 0.01, s) for i, (u, s) in
               enumerate([(0.1, 0.0), (0.5, 0.9), (0.2, 0.0), (0.3, 0.05)])]
    row = summarize_agents(results, lam=1.0)["rows"][0]
    for measure in ("success", "oracle_match"):
        low, high = row[f"{measure}_ci"]
        assert low == 0.0 < row[measure] < high <= 1.0  # a t-interval alone goes below 0
    assert row["utility_ci"][0] < 0.1  # utility is not a fraction: not clipped


def test_phase_regions_beat_one_pool_and_per_call_credit_beats_terminal_credit():
    results = run_agents(episodes=2000, replicates=5, seed=0)
    by = {name: np.array([r.utility for r in results if r.learner == name])
          for name in ("regional", "flat", "regional-percall")}
    summary = summarize_agents(results, 5.0)
    oracle = summary["oracle"]["utility"]
    # per-call credit: close to the oracle, far above one pool
    assert by["regional-percall"].mean() > by["flat"].mean() + 0.1
    assert by["regional-percall"].mean() > oracle - 0.12
    # terminal credit: regions still help on average, paired over the same episode streams
    assert by["regional"].mean() > by["flat"].mean()
    assert (by["regional"] >= by["flat"] - 1e-9).sum() >= 4
    assert all(r.utility <= oracle + 0.03 for r in results)  # nobody beats the optimum


@pytest.mark.parametrize("options, message", [
    ({"learners": ["ghost"]}, "unknown learners"), ({"episodes": 2}, "episodes"),
    ({"replicates": 0}, "replicates"), ({"bandit": "greedy"}, "bandit"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        run_agents(**options)


ADMIN, CLIENT = "admin-agents-key-123", "client-agents-key-456"


def test_episode_feedback_credits_every_call_of_the_episode(tmp_path, monkeypatch, upstreams):
    """Over real HTTP against scripted upstreams: what is tested is the crediting, so the
    answers come at once however loaded the machine (a model server queued its calls past
    the proxy's deadline)."""
    monkeypatch.setenv("TEST_AGENTS_CLIENT", CLIENT)
    monkeypatch.setenv("TEST_AGENTS_ADMIN", ADMIN)
    cfg = ProxyConfig.from_mapping({
        "upstreams": [{"model": m, "base_url": server.url("/v1")}
                      for m, server in zip(("small", "large"), upstreams, strict=True)],
        "state_path": "router.sqlite", "lam": 0.0,
        "prices": {"version": "t", "models": {"small": {"input": 1.0, "output": 1.0},
                                              "large": {"input": 5.0, "output": 5.0}}},
        "auth": {"client_key_env": "TEST_AGENTS_CLIENT", "admin_key_env": "TEST_AGENTS_ADMIN"},
    }, base=tmp_path)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with serve_in_thread(create_app(cfg)) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        calls = []
        for phase in ("plan", "tool", "answer"):  # one agent episode, three turns
            answer = client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"{phase}: say ok"}],
                "max_tokens": 2}, headers={"Authorization": f"Bearer {CLIENT}",
                                           "X-Canopy-Episode": "ep-1",
                                           "X-Canopy-Region": phase})
            assert answer.status_code == 200, answer.text
            assert answer.json()["canopy"]["episode"] == "ep-1"
            calls.append(answer.json()["canopy"]["request_id"])
        other = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "unrelated"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {CLIENT}"}).json()["canopy"]["request_id"]
        assert client.post("/v1/feedback/episode", json={"episode_id": "ep-1", "reward": 1.0},
                           headers={"Authorization": f"Bearer {CLIENT}"}).status_code == 403
        before = client.get("/v1/router/stats", headers=admin).json()
        for bad, status in (({"episode_id": "ep-1", "reward": 1.5}, 422),
                            ({"episode_id": "ep-1"}, 422), ({"episode": "ep-1"}, 400),
                            ({"episode_id": "nope", "reward": 1.0}, 404)):
            assert client.post("/v1/feedback/episode", json=bad,
                               headers=admin).status_code == status, bad
        assert client.get("/v1/router/stats", headers=admin).json() == before
        done = client.post("/v1/feedback/episode", json={"episode_id": "ep-1", "reward": 1.0},
                           headers=admin)
        assert done.status_code == 200 and done.json()["credited"] == 3
        assert sorted(c["request_id"] for c in done.json()["calls"]) == sorted(calls)
        again = client.post("/v1/feedback/episode", json={"episode_id": "ep-1", "reward": 0.0},
                            headers=admin)
        assert again.status_code == 409
        stats = client.get("/v1/router/stats", headers=admin).json()
        assert stats["with_feedback"] == 3 and stats["requests"] == 4
        credited = {r["region"] for r in stats["statistics"] if r["count"] > 0}
        assert {"plan", "tool", "answer"} <= credited
        assert client.post("/v1/feedback", json={"request_id": calls[0], "quality": 0.5},
                           headers=admin).status_code == 409  # already credited
        assert client.post("/v1/feedback", json={"request_id": other, "quality": 0.5},
                           headers=admin).status_code == 200
        long_episode = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {CLIENT}", "X-Canopy-Episode": "e" * 200})
        assert long_episode.status_code == 400
