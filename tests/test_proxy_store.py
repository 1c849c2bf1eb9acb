"""The proxy over a shared store, over real HTTP on loopback: statistics in the same order
after a restart, two proxies on one Redis using each other's ratings, no acknowledged rating
lost to ``kill -9``, a load with an upstream stopped halfway through two processes or two
workers, and a store locked by another process that never stalls health or chat."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from canopy.apps.routing.proxy.app import create_app, serve_in_thread
from canopy.apps.routing.proxy.config import ProxyConfig
from canopy.apps.routing.proxy.loadtest import run_load_test

CLIENT_KEY, ADMIN_KEY = "client-store-key-123", "admin-store-key-456"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"version": "t", "models": {"small": {"input": 1.0, "output": 1.0},
                                     "large": {"input": 50.0, "output": 50.0}}}
ASK = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2}
LOAD = int(os.environ.get("CANOPY_PROXY_LOAD", "240"))  # 1000 for the full measurement


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("TEST_STORE_CLIENT", CLIENT_KEY)
    monkeypatch.setenv("TEST_STORE_ADMIN", ADMIN_KEY)


def _mapping(upstreams, store: str, **extra) -> dict:
    return {"upstreams": [{"model": m, "base_url": s.url("/v1"), "timeout_s": 20}
                          for m, s in zip(("small", "large"), upstreams, strict=True)],
            "store": store, "lam": 100.0, "prices": PRICES,
            "auth": {"client_key_env": "TEST_STORE_CLIENT", "admin_key_env": "TEST_STORE_ADMIN"},
            **extra}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Served:
    """``canopy serve router`` in its own process (its own process group, so ``kill -9``
    reaches every worker)."""

    def __init__(self, config: Path, *, workers: int = 1) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "canopy", "serve", "router", "--config", str(config),
             "--port", str(self.port), "--workers", str(workers)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.process.poll() is None, self.process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.2)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=60)


def test_statistics_keep_their_order_across_a_restart(tmp_path, upstreams):
    """Regions met in the order code/python, chat: the tree holds them as root, code,
    code/python, chat; a restart used to rebuild it parents first (root, code, chat,
    code/python), so the same statistics came back in another row order."""
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, "sqlite:///s.sqlite"), base=tmp_path)
    with serve_in_thread(create_app(cfg)) as url, httpx.Client(base_url=url, headers=ADMIN,
                                                               timeout=30) as client:
        for region in ("code/python", "chat", "code/python"):
            answer = client.post("/v1/chat/completions", json=ASK,
                                 headers={"X-Canopy-Region": region}).json()["canopy"]
            assert client.post("/v1/feedback", json={"request_id": answer["request_id"],
                                                     "quality": 0.5}).status_code == 200
        before = client.get("/v1/router/stats").json()["statistics"]
    with serve_in_thread(create_app(cfg)) as url:
        after = httpx.get(url + "/v1/router/stats", headers=ADMIN, timeout=30).json()
    assert after["statistics"] == before


def test_two_proxies_on_one_redis_use_each_others_ratings(tmp_path, upstreams, redis_url):
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, redis_url), base=tmp_path)
    with serve_in_thread(create_app(cfg)) as one, serve_in_thread(create_app(cfg)) as two, \
            httpx.Client(headers=ADMIN, timeout=30) as client:
        waits = []
        for n in range(12):  # answered by one, rated through the other: large is better
            model = ("small", "large")[n % 2]
            answer = client.post(one + "/v1/chat/completions", json={**ASK, "model": model})
            rid = answer.json()["canopy"]["request_id"]
            t0 = time.monotonic()
            assert client.post(two + "/v1/feedback", json={
                "request_id": rid, "quality": 1.0 if model == "large" else 0.0}
            ).status_code == 200
            while True:
                stats = client.get(one + "/v1/router/stats").json()
                if sum(r["count"] for r in stats["statistics"] if r["region"] == "/") > n:
                    break
                assert time.monotonic() - t0 < 30, "proxy one never saw the rating"
                time.sleep(0.02)
            waits.append(time.monotonic() - t0)
        assert stats["statistics"] == client.get(two + "/v1/router/stats").json()["statistics"]
        picks = {client.post(url + "/v1/chat/completions", json=ASK).json()["canopy"]["model"]
                 for url in (one, two)}
    assert picks == {"large"}  # lam 100 prices large's 12 tokens at 0.06: it still wins
    print(f"\nrating through one proxy used by the other after max {max(waits):.3f} s")


def _drive(urls: list[str], n: int, *, halfway=None) -> tuple[int, int, list[str]]:
    """``n`` chats with feedback, alternating proxies; ``(answered, acknowledged ratings,
    problems)``; ``halfway()`` runs once at request ``n // 2``."""
    answered = acknowledged = 0
    problems = []
    with httpx.Client(headers=ADMIN, timeout=30) as client:
        for i in range(n):
            if i == n // 2 and halfway is not None:
                halfway()
            url = urls[i % len(urls)]
            try:
                answer = client.post(url + "/v1/chat/completions", json=ASK)
                rid = answer.json()["canopy"]["request_id"]
                answered += 1
                rated = client.post(url + "/v1/feedback", json={"request_id": rid,
                                                                "quality": 0.5})
                acknowledged += rated.status_code == 200
            except (httpx.HTTPError, KeyError, ValueError) as error:
                problems.append(f"{i} {url}: {type(error).__name__}")
    return answered, acknowledged, problems


@pytest.mark.parametrize("victim", [0, 1])
def test_kill_9_of_either_proxy_loses_no_acknowledged_rating(tmp_path, upstreams, redis_url,
                                                             victim):
    config = tmp_path / "router.json"
    config.write_text(json.dumps(_mapping(upstreams, redis_url)))
    served = [_Served(config), _Served(config)]
    try:
        _, acknowledged, problems = _drive(
            [s.url for s in served], 60, halfway=served[victim].kill)
        survivor = served[1 - victim]
        stats = httpx.get(survivor.url + "/v1/router/stats", headers=ADMIN, timeout=30).json()
    finally:
        for one in served:
            one.kill()
    assert acknowledged >= 30 and len(problems) <= 30  # the dead proxy's half fails
    assert stats["with_feedback"] == acknowledged
    assert sum(r["count"] for r in stats["statistics"] if r["region"] == "/") == acknowledged


@pytest.mark.parametrize("layout", ["two proxies, Redis", "two workers, SQLite"])
def test_load_with_an_upstream_stopped_halfway_loses_nothing(tmp_path, upstreams, layout,
                                                            request):
    """``LOAD`` chats at 32 at a time with feedback through both proxies (or both workers),
    the cheap upstream stopped halfway: every request answered, every rating acknowledged
    and counted."""
    redis = layout.startswith("two proxies")
    store = request.getfixturevalue("redis_url") if redis else "sqlite:///s.sqlite"
    config = tmp_path / "router.json"
    config.write_text(json.dumps(_mapping(upstreams, store)))
    served = [_Served(config), _Served(config)] if redis else [_Served(config, workers=2)]
    options = {"requests": LOAD // len(served), "concurrency": 32 // len(served),
               "quality": lambda _: 1.0, "api_key": ADMIN_KEY, "request_timeout": 60.0}
    try:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(len(served)) as pool:
            runs = list(pool.map(
                lambda k: run_load_test(served[k].url, **options,
                                        halfway=upstreams[0].close if k == 0 else None),
                range(len(served))))
        time.sleep(0.6)  # two pulls of every worker
        stats = httpx.get(served[0].url + "/v1/router/stats", headers=ADMIN, timeout=30).json()
    finally:
        for one in served:
            one.kill(signal.SIGTERM)
    for run in runs:
        assert run.client_errors == [] and run.error_bodies == []
        assert run.status == {200: options["requests"]}
        assert run.feedback_status == {200: options["requests"]}
    assert sum(run.fallbacks for run in runs) > 0  # requests met the stopped upstream
    total = options["requests"] * len(served)
    assert stats["with_feedback"] == total
    assert sum(r["count"] for r in stats["statistics"] if r["region"] == "/") == total
    print(f"\n{layout}: {total} answered, {total} rated, p99 latency "
          f"{max(run.percentile('latency', 99) for run in runs):.0f} ms")


def test_a_store_locked_by_another_process_never_stalls_health_or_chat(tmp_path, upstreams):
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, "sqlite:///s.sqlite"), base=tmp_path)
    holder = ("import sqlite3, sys\ndb = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "db.execute('BEGIN IMMEDIATE')\nprint('locked', flush=True)\nsys.stdin.read()\n"
              "db.execute('ROLLBACK')\n")
    with serve_in_thread(create_app(cfg)) as url, httpx.Client(base_url=url, headers=ADMIN,
                                                               timeout=60) as client:
        first = client.post("/v1/chat/completions", json=ASK).json()["canopy"]["request_id"]
        lock = subprocess.Popen([sys.executable, "-c", holder, str(cfg.state_path)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert lock.stdout.readline().strip() == b"locked"
            took = {}
            for name, call in (("health", lambda: client.get("/health")),
                               ("chat", lambda: client.post("/v1/chat/completions",
                                                            json=ASK))):
                t0 = time.monotonic()
                answer = call()
                took[name] = time.monotonic() - t0
                assert answer.status_code == 200, answer.text
            during = answer.json()["canopy"]["request_id"]
            busy = client.post("/v1/feedback", json={"request_id": first, "quality": 1.0})
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
            assert lock.poll() is None  # all of this while the lock was held
        finally:
            lock.stdin.close()
            lock.wait(timeout=30)
        for rid in (first, during):
            deadline = time.monotonic() + 30
            while (rated := client.post("/v1/feedback", json={"request_id": rid,
                                                              "quality": 1.0})).status_code == 503:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert rated.status_code == 200, rated.text
    print(f"\nwhile locked: health {took['health']:.3f} s, chat {took['chat']:.3f} s")


def test_store_settings_are_checked_and_an_unreachable_store_is_named(tmp_path, upstreams):
    for bad, message in (({"store": "mysql://x"}, "store must be"),
                         ({"store": "memory", "state_path": "s.sqlite"}, "one of 'store'"),
                         ({"store": 5}, "store must be")):
        data = {**_mapping(upstreams, "memory"), **bad}
        with pytest.raises(ValueError, match=message):
            ProxyConfig.from_mapping(data, base=tmp_path)
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, f"redis://127.0.0.1:{_port()}/0"),
                                   base=tmp_path)
    with pytest.raises(ValueError, match="cannot open the store redis://"):
        create_app(cfg)
    relative = ProxyConfig.from_mapping(_mapping(upstreams, "sqlite:///state/r.sqlite"),
                                        base=tmp_path)
    assert relative.state_path == tmp_path / "state" / "r.sqlite"


def test_requests_past_the_feedback_window_are_forgotten_on_schedule(tmp_path, upstreams):
    """The requests table used to grow for ever: nothing called its expiry."""
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, "sqlite:///s.sqlite",
                                            limits={"feedback_window_s": 1.0}), base=tmp_path)
    with serve_in_thread(create_app(cfg)) as url, httpx.Client(base_url=url, headers=ADMIN,
                                                               timeout=30) as client:
        for _ in range(3):
            assert client.post("/v1/chat/completions", json=ASK).status_code == 200
        deadline = time.monotonic() + 60
        while (kept := client.get("/v1/router/stats").json()["requests"]) > 0:
            assert time.monotonic() < deadline, f"{kept} requests still kept"
            time.sleep(0.1)


def test_a_memory_store_is_written_in_the_proxy_s_thread(tmp_path, upstreams, monkeypatch,
                                                         caplog):
    """A ``memory`` store is this proxy's alone: a chat's call is written as the answer's
    bookkeeping, in the server's thread (no writer thread to hand it to or wait for), and
    can be rated at once."""
    from canopy.regional.store_memory import MemoryStore

    writers: list[str] = []
    add_calls = MemoryStore.add_calls

    def counted(self, calls, ttl_s):
        writers.extend(threading.current_thread().name for _ in calls)
        add_calls(self, calls, ttl_s)

    monkeypatch.setattr(MemoryStore, "add_calls", counted)
    cfg = ProxyConfig.from_mapping(_mapping(upstreams, "memory",
                                            limits={"store_wait_s": 0.2}), base=tmp_path)
    with serve_in_thread(create_app(cfg)) as url, httpx.Client(base_url=url, headers=ADMIN,
                                                               timeout=30) as client:
        ids = [client.post("/v1/chat/completions", json=ASK).json()["canopy"]["request_id"]
               for _ in range(3)]
        rated = client.post("/v1/feedback", json={"request_id": ids[1], "quality": 0.5})
        assert rated.status_code == 200, rated.text
        assert client.get("/v1/router/stats").json()["requests"] == 3
    assert "not stored yet" not in caplog.text
    assert len(writers) == 3 and "canopy-ledger-writer" not in writers
