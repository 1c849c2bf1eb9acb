"""The routing service: one ledger's rules, ratings shared between services over one store
(SQLite and a real Redis), a warm-start prior kept under the stored sums, and a busy store
that degrades ratings, never routing."""

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
              model: str = "cheap", episode: str | None = None, age_s: float = 0.0) -> None:
    service.record(Call(ident, region, model, 0.001, time.time() - age_s, episode)
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
        assert one.ranking("code")[0] == two.ranking("code")[0] == "dear"
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
            assert service.ranking("code")  # routing reads memory only
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
