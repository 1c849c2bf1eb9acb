"""A store restarted empty under running proxies, over real HTTP on loopback: Redis run as a
cache (no persistence) killed with ``-9`` and started again on the same port, and a SQLite
file deleted and re-created under them. What the proxies learnt comes back (every rating
acknowledged before the outage, none counted twice, later ratings added, a call made before
the outage still rated, a call rated through the other proxy before it not rated again);
during the outage the chat path makes no store call."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from canopy.apps.routing.proxy.app import create_app, serve_in_thread
from canopy.apps.routing.proxy.config import ProxyConfig
from redis_server import start_redis
from test_proxy_store import ADMIN, ASK, _mapping, keys  # noqa: F401  (the keys fixture)

SYNC_THREAD = "canopy-service-sync"
PROBE_THREAD = "canopy-store-probe"
METHODS = ("add_calls", "calls", "episode", "rate", "changes", "rated_since", "expire", "counts",
           "ping", "reseed", "check_meta")


class _Counted:
    """Every call on a store class's methods, by the thread that made it."""

    def __init__(self, monkeypatch, cls: type) -> None:
        self.by_thread: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        for name in METHODS:
            if hasattr(cls, name):
                monkeypatch.setattr(cls, name, self._wrap(getattr(cls, name)))

    def _wrap(self, method):
        def counted(store, *args, **kwargs):
            with self._lock:
                self.by_thread[threading.current_thread().name] += 1
            return method(store, *args, **kwargs)
        return counted

    def outside_background(self) -> int:
        """Calls made by any thread but the sync and the store probe threads."""
        with self._lock:
            return sum(n for name, n in self.by_thread.items()
                       if name not in (SYNC_THREAD, PROBE_THREAD))


def _chat(client: httpx.Client, url: str) -> str:
    answer = client.post(url + "/v1/chat/completions", json=ASK)
    assert answer.status_code == 200, answer.text
    return answer.json()["canopy"]["request_id"]


def _rate(client: httpx.Client, url: str, rid: str, deadline_s: float = 60.0) -> None:
    """Rate until acknowledged (503 while the store is busy, down or re-seeded)."""
    deadline = time.monotonic() + deadline_s
    while (rated := client.post(url + "/v1/feedback", json={"request_id": rid,
                                                            "quality": 0.5})).status_code == 503:
        assert rated.headers["Retry-After"] == "1"
        assert time.monotonic() < deadline, "the rating never got through"
        time.sleep(0.1)
    assert rated.status_code == 200, rated.text


def _counted(client: httpx.Client, url: str) -> float:
    stats = client.get(url + "/v1/router/stats").json()
    return sum(r["count"] for r in stats["statistics"] if r["region"] == "/")


def _wait_counts(client: httpx.Client, urls: list[str], want: float) -> list[float]:
    deadline = time.monotonic() + 30
    while (seen := [_counted(client, url) for url in urls]) != [want] * len(urls):
        if time.monotonic() > deadline:
            return seen
        time.sleep(0.05)
    return seen


def _before(client: httpx.Client, urls: list[str]) -> tuple[str, str]:
    """A call made through the first proxy and rated through the second, then 30 ratings
    acknowledged through both proxies, seen by both; and one call made before the outage,
    left to be rated after it. The two calls' ids."""
    elsewhere = _chat(client, urls[0])
    _rate(client, urls[1], elsewhere)
    for i in range(30):
        url = urls[i % 2]
        _rate(client, url, _chat(client, url))
    assert _wait_counts(client, urls, 31.0) == [31.0, 31.0]
    return _chat(client, urls[0]), elsewhere


def _after(client: httpx.Client, urls: list[str], pending: str, elsewhere: str) -> None:
    """The call made before the outage and 9 new ones rated; the call rated before it is
    refused (unknown: the process that made it did not store it again) through either
    proxy: both proxies count 41."""
    _rate(client, urls[1], pending)
    for url in urls:
        deadline = time.monotonic() + 60
        while (again := client.post(url + "/v1/feedback",
                                    json={"request_id": elsewhere, "quality": 0.5})
               ).status_code == 503:
            assert time.monotonic() < deadline, "the rating was never answered"
            time.sleep(0.1)
        assert again.status_code == 404, again.text
    for i in range(9):
        url = urls[i % 2]
        _rate(client, url, _chat(client, url))
    assert _wait_counts(client, urls, 41.0) == [41.0, 41.0]


def test_redis_restarted_empty_under_two_proxies(tmp_path, upstreams, monkeypatch):
    from canopy.regional.store_redis import RedisStore

    counted = _Counted(monkeypatch, RedisStore)
    server, url = start_redis(tmp_path / "redis", persist=False)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, url), base=tmp_path)
    apps = [create_app(cfg), create_app(cfg)]
    try:
        with serve_in_thread(apps[0]) as one, serve_in_thread(apps[1]) as two, \
                httpx.Client(headers=ADMIN, timeout=30) as client:
            urls = [one, two]
            pending, elsewhere = _before(client, urls)
            server.kill()  # -9: everything it held is gone
            server.wait(timeout=30)
            # ratings answer 503 with Retry-After; once both circuits are open, 20 chats
            # make no store call
            rated = client.post(one + "/v1/feedback", json={"request_id": pending,
                                                             "quality": 0.5})
            assert rated.status_code == 503 and rated.headers["Retry-After"] == "1"
            deadline = time.monotonic() + 30
            while not all(getattr(app.state.proxy.service.store, "down", False)
                          for app in apps):
                assert time.monotonic() < deadline, "the store's circuit never opened"
                time.sleep(0.05)
            calls_before = counted.outside_background()
            for i in range(20):
                _chat(client, urls[i % 2])
            assert counted.outside_background() == calls_before
            server, _ = start_redis(tmp_path / "redis", port=port, persist=False)
            _after(client, urls, pending, elsewhere)
    finally:
        server.kill()
        server.wait(timeout=30)


def test_sqlite_deleted_and_recreated_under_two_proxies(tmp_path, upstreams):
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, "sqlite:///s.sqlite"), base=tmp_path)
    path = Path(cfg.state_path)
    with serve_in_thread(create_app(cfg)) as one, serve_in_thread(create_app(cfg)) as two, \
            httpx.Client(headers=ADMIN, timeout=30) as client:
        urls = [one, two]
        pending, elsewhere = _before(client, urls)
        for name in (path.name, path.name + "-wal", path.name + "-shm"):
            (path.parent / name).unlink(missing_ok=True)
        # a third proxy starting on the path re-creates the file, empty
        with serve_in_thread(create_app(cfg)) as three:
            _after(client, urls, pending, elsewhere)
            assert _wait_counts(client, [three], 41.0) == [41.0]
