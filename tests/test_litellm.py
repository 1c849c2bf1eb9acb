"""Canopy as a LiteLLM routing strategy (issue 12 item 2): a real ``litellm.Router`` picks
deployments through :class:`CanopyRouting` and learns from its callbacks and feedback.

The unit tests use LiteLLM's own ``mock_response`` (no network); the live tests route to
llama-cpp-python servers with SmolLM2-135M on loopback."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections import Counter

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
litellm = pytest.importorskip("litellm", reason="needs the litellm extra")

from canopy.integrations.litellm import CanopyRouting  # noqa: E402
from canopy.regional.ledger import AlreadyRated, UnknownCall  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hi."}]


def _deployment(name: str, *, api_base: str = "http://127.0.0.1:9/v1", model: str = "m",
                price: float | None = 1e-6, mock: str | None = "hi") -> dict:
    params: dict = {"model": f"openai/{model}", "api_base": api_base, "api_key": "unused"}
    if price is not None:
        params |= {"input_cost_per_token": price, "output_cost_per_token": price}
    if mock is not None:
        params["mock_response"] = mock
    return {"model_name": "chat", "litellm_params": params, "model_info": {"id": name}}


def _router(*deployments: dict) -> object:
    return litellm.Router(model_list=list(deployments), num_retries=0)


async def _rounds(router, canopy, n: int, quality, region: str | None = None) -> list[str]:
    """``n`` calls, each rated ``quality(deployment)``; the deployments picked, in order."""
    picks = []
    for _ in range(n):
        metadata = {} if region is None else {"canopy_region": region}
        try:
            reply = await router.acompletion(model="chat", messages=MESSAGES, metadata=metadata,
                                             max_tokens=4, temperature=0.0)
        except Exception:  # a failed call: the failure callback credits it
            picks.append("failed")
            continue
        deployment = reply._hidden_params["model_id"]  # LiteLLM's record of who answered
        await canopy.afeedback(reply.id, quality(deployment))
        assert canopy.deployment_of(reply.id) == deployment
        picks.append(deployment)
    return picks


def test_the_better_rated_deployment_is_chosen_more_often():
    router = _router(_deployment("weak"), _deployment("strong"))
    canopy = CanopyRouting(router).install()
    picks = asyncio.run(_rounds(router, canopy, 80, {"weak": 0.3, "strong": 0.8}.get))
    late = Counter(picks[-40:])
    assert late["strong"] >= 34, late  # the weak one only as exploration
    assert canopy.stats()["counts"]["rated"] == 80


def test_regions_learn_their_own_best_deployment():
    router = _router(_deployment("a"), _deployment("b"))
    canopy = CanopyRouting(router).install()
    best = {"code": "a", "chat": "b"}

    async def both() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {"code": [], "chat": []}
        for _ in range(60):
            for region in out:
                out[region] += await _rounds(
                    router, canopy, 1, lambda d, r=region: 0.9 if d == best[r] else 0.2, region)
        return out

    picks = asyncio.run(both())
    for region, chosen in picks.items():
        assert Counter(chosen[-30:])[best[region]] >= 25, (region, Counter(chosen[-30:]))


def test_cost_enters_the_reward_through_lam():
    router = _router(_deployment("cheap", price=1e-7), _deployment("dear", price=1e-3))
    canopy = CanopyRouting(router, lam=100.0).install()
    picks = asyncio.run(_rounds(router, canopy, 60, lambda d: 0.8))  # equal quality
    assert Counter(picks[-30:])["cheap"] >= 26


def test_feedback_is_checked_and_counted_once():
    router = _router(_deployment("only"))
    canopy = CanopyRouting(router).install()

    async def session() -> None:
        reply = (await router.acompletion(model="chat", messages=MESSAGES)).id
        with pytest.raises(UnknownCall, match="unknown"):
            await canopy.afeedback("chatcmpl-never-seen", 0.5, wait_s=0.1)
        await canopy.afeedback(reply, 0.5)
        for bad, error in ((math.nan, ValueError), (1.5, ValueError), (-0.1, ValueError),
                           ("0.5", TypeError), (True, TypeError)):
            with pytest.raises(error, match="quality"):
                canopy.feedback(reply, bad)
        with pytest.raises(AlreadyRated, match="already has feedback"):
            canopy.feedback(reply, 0.5)

    asyncio.run(session())
    assert canopy.stats()["counts"]["rated"] == 1


def test_a_reply_without_a_price_is_not_learned_as_free():
    router = _router(_deployment("unpriced", price=None, model="not-in-any-cost-map"))
    canopy = CanopyRouting(router, success_quality=1.0).install()

    async def one() -> None:
        await router.acompletion(model="chat", messages=MESSAGES)
        await asyncio.sleep(0.2)

    asyncio.run(one())
    stats = canopy.stats()
    assert stats["counts"]["unpriced"] == 1
    assert all(row["count"] == 0 for row in stats["groups"]["chat"])


def test_random_regions_never_grow_the_table_past_its_bound():
    router = _router(_deployment("a"), _deployment("b"))
    canopy = CanopyRouting(router, max_regions=16).install()
    for i in range(2_000):
        canopy.get_available_deployment("chat", MESSAGES,
                                        request_kwargs={"metadata": {"canopy_region": f"r{i}/x"}})
    assert canopy.services["chat"].router.regions.n_nodes <= 16


@pytest.mark.parametrize("settings, message", [
    ({"lam": -1.0}, "lam"), ({"learner": "greedy"}, "learner"), ({"sharing": "x"}, "sharing"),
    ({"failure_quality": 2.0}, "failure_quality"), ({"latency_price": math.inf}, "latency"),
    ({"max_regions": 0}, "max_regions"), ({"region": {"colour": 1}}, "region keys"),
])
def test_bad_settings_are_refused_at_construction(settings, message):
    with pytest.raises(ValueError, match=message):
        CanopyRouting(_router(_deployment("a")), **settings)


def test_an_unknown_model_group_is_named():
    canopy = CanopyRouting(_router(_deployment("a")))
    with pytest.raises(ValueError, match="no deployment serves model group 'nope'"):
        canopy.get_available_deployment("nope", MESSAGES, request_kwargs={})


# -- live: real llama-cpp-python servers on loopback --------------------------------------
def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_live_router_learns_from_feedback_over_real_servers(llm_server):
    base = llm_server.base_url
    router = _router(_deployment("first", api_base=base, model=llm_server.model, mock=None),
                     _deployment("second", api_base=base, model=llm_server.model, mock=None))
    canopy = CanopyRouting(router).install()
    picks = asyncio.run(_rounds(router, canopy, 40, {"first": 0.2, "second": 0.9}.get))
    assert Counter(picks[-20:])["second"] >= 16, Counter(picks)
    counts = canopy.stats()["counts"]
    assert counts["succeeded"] == 40 and counts["rated"] == 40 and counts["unpriced"] == 0


def test_live_failures_are_credited_and_the_dead_deployment_avoided(llm_server):
    dead = f"http://127.0.0.1:{_dead_port()}/v1"
    router = _router(_deployment("live", api_base=llm_server.base_url, model=llm_server.model,
                                 mock=None),
                     _deployment("dead", api_base=dead, model=llm_server.model, mock=None))
    canopy = CanopyRouting(router, failure_quality=0.0).install()
    picks = asyncio.run(_rounds(router, canopy, 30, lambda d: 0.7))
    assert canopy.stats()["counts"]["failed"] == picks.count("failed") >= 1
    assert Counter(picks[-15:])["live"] >= 13, Counter(picks)


def test_the_documented_example_runs_as_written(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "routing.md").read_text()
    block = re.search(r"## LiteLLM.*?```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "docs/routing.md", "exec"), {"__name__": "__docs__"})
    printed = capsys.readouterr().out
    assert "'routed': 20" in printed and "'rated': 20" in printed


# -- the routing service underneath: cooldowns, breaker, stores ---------------------------
def _scripted_deployment(name: str, server) -> dict:
    return _deployment(name, api_base=server.url("/v1"), mock=None)


def test_a_failing_best_deployment_is_left_within_a_few_calls(scripted_server):
    """The deployment rated best (0.9 against 0.2) starts answering 500: with no retries,
    LiteLLM's cooldown and the service's breaker take it out of the picks within a few
    failed calls (at most 5 of the next 80)."""
    from llm_server import ScriptedServer

    failing = {"now": False}
    def answer(number: int) -> tuple[int, bytes, float]:
        if failing["now"]:
            return 500, b'{"error": {"message": "down"}}', 0.0
        body = ScriptedServer.chat_body("hi").replace(b'"id": "x"', f'"id": "r{number}"'.encode())
        return 200, body, 0.0

    scripted_server.routes["/v1/chat/completions"] = answer
    router = _router(_scripted_deployment("best", scripted_server), _deployment("backup"))
    canopy = CanopyRouting(router).install()
    before = asyncio.run(_rounds(router, canopy, 40, {"best": 0.9, "backup": 0.2}.get))
    assert Counter(before[-20:])["best"] >= 16
    failing["now"] = True
    after = asyncio.run(_rounds(router, canopy, 80, {"best": 0.9, "backup": 0.2}.get))
    print(f"\nafter the best deployment started failing: {Counter(after)} of 80 calls")
    assert after.count("failed") <= 5, Counter(after)
    assert after.count("backup") >= 75


def test_a_cooled_down_deployment_is_never_picked():
    router = _router(_deployment("a"), _deployment("b"))
    canopy = CanopyRouting(router).install()
    asyncio.run(_rounds(router, canopy, 10, {"a": 0.9, "b": 0.1}.get))
    router.health().cooldowns.add_deployment_to_cooldown("a", RuntimeError("x"), 500, 60)
    picks = asyncio.run(_rounds(router, canopy, 10, {"a": 0.9, "b": 0.1}.get))
    assert set(picks) == {"b"}
    sync = {canopy.get_available_deployment("chat", MESSAGES, request_kwargs={})["model_info"]
            ["id"] for _ in range(5)}
    assert sync == {"b"}


def test_metadata_none_is_a_request_without_metadata():
    canopy = CanopyRouting(_router(_deployment("a")))
    picked = canopy.get_available_deployment("chat", MESSAGES,
                                             request_kwargs={"metadata": None})
    assert picked["model_info"]["id"] == "a"


def test_what_was_learned_survives_a_restart(tmp_path):
    store = f"sqlite:///{tmp_path / 'litellm.sqlite'}"
    router = _router(_deployment("weak"), _deployment("strong"))
    canopy = CanopyRouting(router, store=store).install()
    asyncio.run(_rounds(router, canopy, 30, {"weak": 0.3, "strong": 0.8}.get))
    before = canopy.stats()["groups"]["chat"]
    canopy.close()
    restarted = CanopyRouting(_router(_deployment("weak"), _deployment("strong")),
                              store=store)
    restarted.get_available_deployment("chat", MESSAGES, request_kwargs={})
    assert restarted.stats()["groups"]["chat"] == before
    assert sum(r["count"] for r in before if r["region"] == "/") == 30


def test_a_rating_route_for_litellm_proxy_users(tmp_path, monkeypatch):
    """Replies routed by one LiteLLM process, rated over HTTP through another that only
    shares the store (what a LiteLLM proxy's pass-through endpoint forwards to)."""
    pytest.importorskip("fastapi")
    import httpx

    from canopy.apps.routing.proxy.app import serve_in_thread
    from canopy.integrations.litellm_feedback import feedback_app

    monkeypatch.setenv("TEST_CANOPY_RATING_KEY", "rating-key-1234567")
    store = f"sqlite:///{tmp_path / 'litellm.sqlite'}"
    router = _router(_deployment("weak"), _deployment("strong"))
    routing = CanopyRouting(router, store=store).install()
    rater = CanopyRouting(store=store)  # no router: it only rates

    async def calls() -> list:
        replies = [await router.acompletion(model="chat", messages=MESSAGES) for _ in range(12)]
        await asyncio.sleep(0.5)  # LiteLLM runs its success callbacks after the reply
        return replies

    replies = asyncio.run(calls())
    deadline = time.monotonic() + 30
    while routing.stats()["pending"] < 12:  # LiteLLM's callbacks run after the replies
        assert time.monotonic() < deadline, routing.stats()
        time.sleep(0.05)
    auth = {"Authorization": "Bearer rating-key-1234567"}
    with serve_in_thread(feedback_app(rater, admin_key_env="TEST_CANOPY_RATING_KEY")) as url:
        statuses = [httpx.post(url + "/v1/feedback", headers=auth, timeout=30, json={
            "request_id": r.id, "quality": 0.9 if r._hidden_params["model_id"] == "strong"
            else 0.2}).status_code for r in replies]
        again = httpx.post(url + "/v1/feedback", headers=auth, timeout=30,
                           json={"request_id": replies[0].id, "quality": 0.5})
        unknown = httpx.post(url + "/v1/feedback", headers=auth, timeout=30,
                             json={"request_id": "nope", "quality": 0.5})
        invalid = httpx.post(url + "/v1/feedback", headers=auth, timeout=30,
                             json={"request_id": replies[1].id, "quality": "high"})
        refused = httpx.post(url + "/v1/feedback", timeout=30,
                             json={"request_id": replies[1].id, "quality": 0.5})
    assert statuses == [200] * 12
    assert (again.status_code, unknown.status_code, refused.status_code) == (409, 404, 401)
    # the ledger's errors as they are, the same as the routing proxy's own route answers
    assert [answer.json()["error"]["code"] for answer in (again, unknown, invalid)] == [
        "duplicate_feedback", "unknown_request", "invalid_rating"]
    assert invalid.status_code == 422
    deadline = time.monotonic() + 30
    while sum(r["count"] for r in routing.stats()["groups"]["chat"] if r["region"] == "/") < 12:
        assert time.monotonic() < deadline, "the routing process never saw the ratings"
        time.sleep(0.05)
    routing.close()
    rater.close()


def test_a_deployment_joining_the_group_keeps_what_was_learned():
    router = _router(_deployment("a"), _deployment("b"))
    canopy = CanopyRouting(router).install()
    asyncio.run(_rounds(router, canopy, 10, lambda d: 0.5))
    router.add_deployment(litellm.types.router.Deployment(**_deployment("c")))
    picks = asyncio.run(_rounds(router, canopy, 6, lambda d: 0.5))
    rows = {r["model"]: r["count"] for r in canopy.stats()["groups"]["chat"]
            if r["region"] == "/"}
    assert rows["a"] + rows["b"] + rows.get("c", 0) == 16
    assert "c" in picks  # the newcomer is tried first


def test_unknown_reply_is_a_deprecated_name_for_the_ledgers_errors():
    import canopy.integrations.litellm as module
    from canopy.regional.ledger import FeedbackError

    with pytest.warns(DeprecationWarning, match=r"canopy\.regional\.ledger\.FeedbackError"):
        assert module.UnknownReply is FeedbackError
