"""The routing service: its decision (:meth:`route`: region and ranking) and the outcomes
it hears (:meth:`outcome`), one ledger's rules and its typed refusals, ratings shared between
services over one store (SQLite and a real Redis), a warm-start prior kept under the stored
sums, a busy store that degrades ratings, never routing; and the names that moved into
:mod:`canopy.regional`, still importable from their old place with a warning."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest

from canopy.regional import RegionalRouter
from canopy.regional.ledger import AlreadyRated, FeedbackExpired, UnknownCall
from canopy.regional.service import RoutingService
from canopy.regional.store import Call, StoreBusy

MODELS = ("cheap", "dear")


def _service(store: str, **options) -> RoutingService:
    return RoutingService(RegionalRouter(MODELS, lam=10.0), store, **options)


def _answered(service: RoutingService, ident: str, *, region: str = "code",
              model: str = "cheap", episode: str | None = None, age_s: float = 0.0,
              cost: float = 0.001) -> None:
    service.record(Call(ident, region, model, cost, time.time() - age_s, episode)
                   ).result(timeout=30)


@pytest.fixture(params=["sqlite", "redis"])
def shared(request, tmp_path) -> str:
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return f"sqlite:///{tmp_path / 'state.sqlite'}"


def test_the_ledger_rules_one_rating_per_call_within_the_window():
    service = _service("memory", window_s=60.0, sync_s=0)
    try:
        _answered(service, "r1")
        _answered(service, "old", age_s=120.0)
        assert service.rate("r1", 0.75).model == "cheap"
        for ident, error in (("r1", AlreadyRated), ("nope", UnknownCall),
                             ("old", FeedbackExpired)):
            with pytest.raises(error):
                service.rate(ident, 0.5)
        with pytest.raises(ValueError):
            service.rate("r1", 1.5)
        for n in range(3):
            _answered(service, f"e{n}", region=f"phase{n}", episode="ep", model=MODELS[n % 2])
        assert [c.id for c in service.rate_episode("ep", 1.0)] == ["e0", "e1", "e2"]
        with pytest.raises(AlreadyRated):
            service.rate_episode("ep", 0.0)
        rows = {(r["region"], r["model"]): r["count"] for r in service.estimates()}
        assert rows[("/", "cheap")] == 3 and rows[("/", "dear")] == 1
        assert rows[("phase1", "dear")] == 1
    finally:
        service.close()


def test_ratings_through_one_service_reach_another_within_a_second(shared):
    """Two services on one store, as two workers or two machines: each ranks with the
    other's ratings after its next pull (every 0.25 s)."""
    one, two = _service(shared), _service(shared)
    try:
        for n in range(20):
            _answered(one, f"a{n}", model=MODELS[n % 2])
        waited = []
        for n in range(20):  # the dear model is rated better; rated through the other worker
            t0 = time.monotonic()
            two.rate(f"a{n}", 0.9 if n % 2 else 0.1)
            while sum(r["count"] for r in one.estimates() if r["region"] == "/") < n + 1:
                assert time.monotonic() - t0 < 30, "the rating never reached the other service"
                time.sleep(0.01)
            waited.append(time.monotonic() - t0)
        assert one.estimates() == two.estimates()
        assert one.route("code").ranking[0] == two.route("code").ranking[0] == "dear"
        print(f"rating seen by the other service after median {np.median(waited):.3f} s, "
              f"max {max(waited):.3f} s")
    finally:
        one.close()
        two.close()


def test_a_warm_start_prior_stays_under_the_shared_ratings(tmp_path):
    router = RegionalRouter(MODELS, lam=10.0)
    for _ in range(30):  # logged outcomes: dear is better
        router.update("code", "dear", 0.9, 0.001)
        router.update("code", "cheap", 0.2, 0.001)
    service = RoutingService(router, f"sqlite:///{tmp_path / 's.sqlite'}", sync_s=0)
    try:
        _answered(service, "r", model="cheap")
        service.rate("r", 1.0)
        rows = {(r["region"], r["model"]): r for r in service.estimates()}
        assert rows[("code", "cheap")]["count"] == 31 and rows[("code", "dear")]["count"] == 30
        assert rows[("code", "cheap")]["mean_reward"] == pytest.approx(
            (30 * (0.2 - 0.01) + (1.0 - 0.01)) / 31)
    finally:
        service.close()


def test_a_locked_store_degrades_ratings_not_routing(tmp_path):
    path = tmp_path / "s.sqlite"
    service = _service(f"sqlite:///{path}", wait_s=0.2)
    try:
        _answered(service, "before")
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            stored = service.record(Call("during", "code", "dear", 0.001, time.time()))
            assert service.route("code").ranking  # routing reads memory only
            with pytest.raises(StoreBusy):
                service.rate("before", 1.0)
            with pytest.raises(StoreBusy, match="not stored yet"):
                service.rate("during", 1.0)  # queued: retry later, not "unknown"
            assert not stored.done()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        stored.result(timeout=30)  # the writer stored it once the lock went
        service.rate("during", 1.0)
        service.rate("before", 1.0)
        assert service.counts() == {"requests": 2, "with_feedback": 2}
    finally:
        service.close()


def test_route_names_the_region_and_ranks_the_models_within_it():
    """The service's decision: the region from a given path or the request's text (bounded),
    the better-rated model first there, the allowed ones only, a request's own trade-off."""
    from canopy.regional.service import Route
    from canopy.regional.sources import RegionConfig, RegionSource

    rules = RegionConfig.from_mapping({"rules": [{"pattern": "(?i)python", "region": "code"}]})
    service = RoutingService(RegionalRouter(MODELS, lam=10.0), "memory", sync_s=0,
                             regions=RegionSource(rules, max_regions=8))
    try:
        for n in range(40):  # in "code", dear (0.9, $0.01) beats cheap (0.3, $0.0001)
            model = MODELS[n % 2]
            _answered(service, f"c{n}", model=model, cost=0.01 if n % 2 else 0.0001)
            service.rate(f"c{n}", 0.9 if model == "dear" else 0.3)
        asked = {"messages": [{"role": "user", "content": "fix my Python loop"}]}
        route = service.route(None, asked)
        assert isinstance(route, Route) and route == ("code", ("dear", "cheap"))
        assert service.route("code/python", None).region == "code/python"
        assert service.route(None, asked, allowed=["cheap"]).ranking == ("cheap",)
        # a request that prices cost 1000 times higher re-weighs by the mean costs recorded
        costs = {"cheap": 0.0, "dear": 0.001}  # this request's estimates
        assert service.route(None, asked, lam=10_000.0, costs=costs).ranking[0] == "cheap"
        assert service.route(None, asked, costs=costs, max_cost=0.0005).ranking == ("cheap",)
        with pytest.raises(ValueError, match="characters"):
            service.route("x" * 2000, asked)
        with pytest.raises(TypeError, match="lam"):
            service.route(None, asked, lam="high", costs=costs)
        for n in range(20):  # new regions past max_regions nodes: their nearest ancestor
            service.route(f"code/r{n}", None)
        assert service.route("code/new", None).region == "code"
    finally:
        service.close()


def test_outcome_sets_a_failing_model_aside_until_it_answers_again():
    service = _service("memory", sync_s=0, breaker_failures=2, breaker_cooldown_s=60.0)
    try:
        first = service.route("code").ranking[0]
        service.outcome(first, ok=False)
        assert service.ejected() == [] and service.route("code").ranking[0] == first
        service.outcome(first, ok=False)
        assert service.ejected() == [first]
        assert service.route("code").ranking[-1] == first  # tried last, not dropped
        service.outcome(first, ok=True)
        assert service.ejected() == [] and service.route("code").ranking[0] == first
    finally:
        service.close()


def test_a_refused_rating_carries_its_status_and_code_in_its_type():
    from canopy.regional.ledger import FeedbackError, InvalidRating

    service = _service("memory", sync_s=0)
    try:
        _answered(service, "r1")
        rated = service.rate("r1", 0.5)
        assert rated.quality == 0.5 and service.reward(0.5, rated.cost) == 0.5 - 10 * 0.001
        refusals = [(lambda: service.rate("r1", 0.5), AlreadyRated, 409, "duplicate_feedback"),
                    (lambda: service.rate("nope", 0.5), UnknownCall, 404, "unknown_request"),
                    (lambda: service.rate("r1", "0.5"), TypeError, 422, "invalid_rating"),
                    (lambda: service.rate("r1", 1.5), ValueError, 422, "invalid_rating"),
                    (lambda: service.rate_episode("ep", True), TypeError, 422,
                     "invalid_rating")]
        for attempt, kind, status, code in refusals:
            with pytest.raises(FeedbackError) as refused:
                attempt()
            assert isinstance(refused.value, kind)
            assert (refused.value.status, refused.value.code) == (status, code)
        assert issubclass(InvalidRating, FeedbackError)
    finally:
        service.close()


@pytest.mark.parametrize("old, name, new", [
    ("canopy.apps.routing.proxy.config", "RegionConfig", "canopy.regional.sources"),
    ("canopy.apps.routing.proxy.regions", "RegionSource", "canopy.regional.sources"),
    ("canopy.apps.routing.proxy.regions", "load_classifier", "canopy.regional.sources"),
    ("canopy.regional.store", "open_store", "canopy.regional.stores"),
    ("canopy.apps.routing.proxy.guard", "Breaker", "canopy.regional.breaker"),
    ("canopy.apps.routing.proxy.guard", "user_text", "canopy.regional.sources"),
    ("canopy.apps.routing.proxy.embed", "NearestCentroid", "canopy.regional.embed"),
])
def test_moved_names_still_import_from_their_old_place_with_a_warning(old, name, new):
    import importlib

    pytest.importorskip("fastapi")
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_the_documented_example_runs_as_written(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "routing.md").read_text()
    block = re.search(r"## The routing service.*?```python\n(.*?)```", text, re.S).group(1)
    scope = {"__name__": "__docs__"}
    exec(compile(block, "docs/routing.md", "exec"), scope)
    assert (scope["region"], scope["ranking"]) == ("code", ("small", "large"))


def test_observations_wait_out_a_locked_store_bounded_and_count_once(tmp_path):
    """Outcomes that await no rating (a gateway's TTFTs): learnt at once where observed,
    kept through a locked store (the most recent ``max_queued``), then added once and read
    by every service on the store."""
    path = tmp_path / "s.sqlite"
    service = _service(f"sqlite:///{path}", wait_s=0.2, sync_s=0, max_queued=5)
    other = _service(f"sqlite:///{path}", sync_s=0)

    def count(svc: RoutingService) -> int:
        return sum(row["count"] for row in svc.estimates() if row["region"] == "code")

    try:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            for _ in range(8):
                service.observe("code", "cheap", 0.0, 0.01)
            assert count(service) == 8  # learnt here at once
            with pytest.raises(StoreBusy):
                service.sync()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        service.sync()
        service.sync()  # nothing left to add: counted once
        other.sync()
        assert count(service) == count(other) == 5  # the 3 oldest were dropped
        assert service.scores("code").tolist() == other.scores("code").tolist()
        with pytest.raises(ValueError):
            service.observe("code", "cheap", 2.0, 0.01)  # a quality outside [0, 1]
    finally:
        service.close()
        other.close()


def test_only_a_store_this_service_opened_in_memory_is_its_own():
    """A ``memory`` store opened from its URL is read by this process alone (nobody need wait
    for a call to be stored before handing out its id); any other store may be shared."""
    from canopy.regional.store_memory import MemoryStore

    for store, shared in (("memory", False), (MemoryStore(), True)):
        service = _service(store, sync_s=0)
        try:
            assert service.shared_store is shared
            _answered(service, "r1")
            assert service.rate("r1", 0.5).model == "cheap"
        finally:
            service.close()


def test_a_service_of_one_model_ranks_it_without_scoring(monkeypatch):
    """With one model there is nothing to rank: no index is computed, yet the request's
    region is made as scoring makes it, the breaker and ``max_cost`` still apply."""
    router = RegionalRouter(("only",), lam=1.0)
    service = RoutingService(router, "memory", sync_s=0)
    scored: list[str] = []
    monkeypatch.setattr(router, "scores", scored.append)
    try:
        assert service.route("code/python") == ("code/python", ("only",))
        assert "code/python" in router.regions and scored == []
        assert service.route("code", costs={"only": 2.0}, max_cost=1.0).ranking == ()
        assert service.route("code", lam=0.5, costs={"only": 0.1}).ranking == ("only",)
    finally:
        service.close()
