"""The routing service's stores (memory, SQLite, a real Redis on loopback) behind one
protocol: a rating is atomic and counted once, sums from many threads add up exactly to the
moments of the rewards, changes are read incrementally, calls expire."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from canopy.regional.circuit import StoreCircuit, StoreDown
from canopy.regional.ledger import FeedbackLedger
from canopy.regional.store import (
    Call,
    Cell,
    Increment,
    StoreBusy,
    StoreReset,
    StoreUnreachable,
    moments,
)
from canopy.regional.stores import open_store


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    else:
        url = "memory"
    opened = open_store(url, namespace="test")
    opened.check_meta(["a", "b"], 1.0)
    yield opened
    opened.close()


def _call(ident: str, *, region: str = "code", model: str = "a", cost: float = 0.01,
          created: float | None = None, episode: str | None = None) -> Call:
    return Call(ident, region, model, cost, time.time() if created is None else created,
                episode)


def _inc(reward: float, model: str = "a") -> list[Increment]:
    return [Increment("", model, 1.0, reward), Increment("code", model, 1.0, reward)]


def test_a_rating_is_atomic_and_counted_once(store):
    store.add_calls([_call("r1"), _call("r2"), _call("r3")], 60)
    assert store.rate(["r1"], 0.5, _inc(0.49), 0.01)
    assert not store.rate(["r1"], 0.9, _inc(0.89), 0.01)  # rated already
    assert not store.rate(["r2", "r1"], 0.9, _inc(0.89) * 2, 0.01)  # all or nothing
    assert not store.rate(["nope"], 0.9, _inc(0.89), 0.01)
    assert store.calls(["r2"])[0].quality is None
    assert store.calls(["r1", "nope"])[0].quality == 0.5
    cells = {(c.region, c.model): c for c in store.changes(0).cells}
    assert set(cells) == {("", "a"), ("code", "a")} and cells[("", "a")].n == 1.0
    assert store.counts() == {"requests": 3, "with_feedback": 1}


def test_sums_from_many_threads_give_the_rewards_moments(store):
    rng = np.random.default_rng(0)
    rewards = rng.uniform(-0.5, 1.0, size=120)
    store.add_calls([_call(f"c{i}") for i in range(120)], 60)

    def rate(part: range) -> None:
        for i in part:
            assert store.rate([f"c{i}"], 0.5, _inc(float(rewards[i])), 0.01)

    threads = [threading.Thread(target=rate, args=(range(k, 120, 4),)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    changes = store.changes(0)
    root = next(c for c in changes.cells if c.region == "")
    count, mean, m2 = moments(root.n, root.s, root.q)
    assert count == 120
    assert mean == pytest.approx(rewards.mean(), abs=1e-12)
    assert m2 / count == pytest.approx(rewards.var(), rel=1e-9)
    assert changes.version >= 120 and store.changes(changes.version).cells == ()


def test_changes_are_read_incrementally_and_meta_guards_lam(store):
    store.add_calls([_call("x"), _call("y", model="b", region="chat")], 60)
    store.rate(["x"], 1.0, _inc(0.99), 0.01)
    seen = store.changes(0).version
    store.rate(["y"], 1.0, [Increment("", "b", 1.0, 0.5), Increment("chat", "b", 1.0, 0.5)],
               0.02)
    later = store.changes(seen)
    assert {(c.region, c.model) for c in later.cells} == {("", "b"), ("chat", "b")}
    assert later.cost_max == pytest.approx(0.02)
    with pytest.raises(ValueError, match="lam"):
        store.check_meta(["a", "b"], 2.0)


def test_episodes_and_expiry(store):
    now = time.time()
    store.add_calls([_call("e2", episode="ep", created=now - 5),
                     _call("e1", episode="ep", created=now - 10),
                     _call("old", created=now - 1000)], 60)
    assert [c.id for c in store.episode("ep")] == ["e1", "e2"]
    assert store.episode("other") == []
    assert store.expire(now - 100) == 1
    assert store.calls(["old"]) == [None]
    assert store.counts()["requests"] == 2


def test_the_ids_each_rating_marked_are_kept_for_rated_kept_versions(store):
    store.rated_kept = 3
    store.add_calls([_call(f"k{i}") for i in range(5)], 60)
    start = store.changes(0).version
    assert store.rated_since(start) == []
    assert store.rate(["k0"], 0.5, _inc(0.49), 0.01)
    first = store.changes(0).version
    assert store.rate(["k1", "k2"], 0.5, _inc(0.49) * 2, 0.01)
    assert sorted(store.rated_since(start)) == ["k0", "k1", "k2"]
    assert sorted(store.rated_since(first)) == ["k1", "k2"]
    assert not store.rate(["k1"], 0.5, _inc(0.49), 0.01)  # refused: nothing marked
    assert store.rate(["k3"], 0.5, _inc(0.49), 0.01)
    assert store.rate(["k4"], 0.5, _inc(0.49), 0.01)
    assert store.rated_since(start) is None  # k0's version is no longer kept
    assert sorted(store.rated_since(first)) == ["k1", "k2", "k3", "k4"]


def test_calls_rated_through_another_ledger_are_not_stored_again(store):
    """What a ledger stores again after a reset (:meth:`FeedbackLedger.restore`) leaves out
    the calls rated through another ledger, read from the store's marks at a pull, or, when
    the store no longer keeps them all, looked up one by one."""
    ledgers = [FeedbackLedger(store, reward=lambda q, c: q, chain=lambda r: [r],
                              wait_s=30.0) for _ in range(2)]
    mine, other = ledgers
    try:
        since = store.changes(0).version
        for n in range(4):
            mine.record(_call(f"m{n}")).result(timeout=30)
        other.rate("m0", 0.5)
        mine.rate("m1", 0.5)
        now = store.changes(0).version
        mine.forget_rated(since)
        assert mine.restore() == 2  # m2 and m3 still await a rating
        store.rated_kept = 1
        other.rate("m2", 0.5)
        store.rate([], 0.0, _inc(0.5), 0.01)
        assert store.rated_since(now) is None
        mine.forget_rated(now)
        assert mine.restore() == 1
    finally:
        for ledger in ledgers:
            ledger.close(timeout=30.0)


def test_a_locked_sqlite_store_is_busy_within_its_wait(tmp_path):
    import sqlite3

    path = tmp_path / "s.sqlite"
    store = open_store(f"sqlite:///{path}", wait_s=0.2)
    store.check_meta(["a"], 0.0)
    store.add_calls([_call("r")], 60)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreBusy, match="locked"):
            store.rate(["r"], 1.0, _inc(1.0), 0.0)
        assert store.changes(0).cells == ()  # reads go on (WAL)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.rate(["r"], 1.0, _inc(1.0), 0.0)


def test_bad_store_urls_are_named():
    for bad, message in (("mysql://x", "unknown store scheme"), ("", "store must be"),
                         ("sqlite://", "sqlite:///")):
        with pytest.raises(ValueError, match=message):
            open_store(bad)


def _wipe(url: str, path) -> None:
    """Empty the store as a restart without persistence (Redis) or a deleted file does."""
    if url.startswith("redis"):
        import redis

        redis.Redis.from_url(url).flushall()
    else:
        for name in (path.name, path.name + "-wal", path.name + "-shm"):
            (path.parent / name).unlink(missing_ok=True)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_reset_store_is_reseeded_once_and_adopted_by_the_others(kind, tmp_path, request):
    """Two processes' stores over one store that is emptied: both see ``StoreReset`` on a
    read and on a rating (nothing written); the first re-seed adds its sums, the second
    adopts them, so each cell is counted once; ratings then add to them."""
    path = tmp_path / "state.sqlite"
    url = request.getfixturevalue("redis_url") if kind == "redis" else f"sqlite:///{path}"
    one, two = open_store(url, namespace="t"), open_store(url, namespace="t")
    for store in (one, two):
        store.check_meta(["a", "b"], 1.0)
    one.add_calls([_call("r1"), _call("r2")], 60)
    assert one.rate(["r1"], 0.5, _inc(0.49), 0.01)
    before = {(c.region, c.model): c for c in two.changes(0).cells}
    _wipe(url, path)
    for store in (one, two):
        with pytest.raises(StoreReset):
            store.changes(0)
        with pytest.raises(StoreReset):
            store.calls(["r2"])
    two.add_calls([_call("r3")], 60)  # the writer may store calls before anyone notices
    with pytest.raises(StoreReset):
        two.rate(["r3"], 0.5, _inc(0.49), 0.01)
    cells = [Cell(c.region, c.model, c.n, c.s, c.q) for c in before.values()]
    assert one.reseed(cells, 0.01) is True
    assert two.reseed(cells, 0.01) is False  # adopted: not added twice
    assert one.generation == two.generation
    after = {(c.region, c.model): c for c in two.changes(0).cells}
    assert after == before
    one.add_calls([_call("r2")], 60)  # stored again by the process that made it
    assert two.rate(["r2"], 1.0, _inc(0.99), 0.01)
    assert one.changes(0).cells and \
        next(c for c in one.changes(0).cells if c.region == "").n == 2.0
    for store in (one, two):
        store.close()


class _Down:
    """A store that fails until ``up``, its calls counted (what the circuit must spare it)."""

    url, generation = "down://", None

    def __init__(self) -> None:
        self.stored = self.pings = 0
        self.up = self.locked = False

    def ping(self) -> None:
        self.pings += 1
        if not self.up:
            raise StoreUnreachable("down")

    def add_calls(self, calls, ttl_s) -> None:
        self.stored += 1
        if self.locked:
            raise StoreBusy("locked")
        if not self.up:
            raise StoreUnreachable("down")

    def close(self) -> None:
        pass


def test_the_circuit_fails_at_once_while_the_store_is_down_and_probes_it():
    inner = _Down()
    circuit = StoreCircuit(inner, failures=2, probe_s=0.01)  # type: ignore[arg-type]
    inner.locked = True  # a locked store is no failure
    for _ in range(5):
        with pytest.raises(StoreBusy):
            circuit.add_calls([_call("x")], 60)
    assert not circuit.down
    inner.locked = False
    for _ in range(2):
        with pytest.raises(StoreUnreachable):
            circuit.add_calls([_call("x")], 60)
    assert circuit.down and circuit.opened == 1 and inner.stored == 7
    ledger = FeedbackLedger(circuit, reward=lambda q, c: q, chain=lambda r: [r])
    try:
        stored = ledger.record(_call("y"))
        assert stored.done() and isinstance(stored.exception(), StoreDown)  # no wait
        for _ in range(50):
            with pytest.raises(StoreDown):
                circuit.add_calls([_call("z")], 60)
        assert inner.stored == 7  # neither these nor the ledger's writer reached it
        deadline = time.monotonic() + 30
        while inner.pings < 3:  # probed in the background
            assert time.monotonic() < deadline
            time.sleep(0.01)
        inner.up = True
        while circuit.down or inner.stored < 8:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        ledger.close()
        circuit.close()
    assert circuit.opened == 1 and inner.stored == 8  # the queued call, stored once up


def test_connections_of_threads_that_are_gone_are_closed(tmp_path):
    """A server's worker threads come and go; each used to keep its SQLite connection (and
    its page cache) open to the end: 250 open on one file after a 27,000-request soak."""
    import os
    from pathlib import Path

    path = tmp_path / "state.sqlite"
    store = open_store(f"sqlite:///{path}")
    store.check_meta(["a"], 0.0)

    def open_on_file() -> int:
        fds = Path("/proc/self/fd")
        return sum(os.path.realpath(fd) == str(path) for fd in fds.iterdir())

    for _ in range(20):
        worker = threading.Thread(target=store.counts)
        worker.start()
        worker.join()
    store.counts()  # this thread's connection: the finished threads' are closed
    assert open_on_file() <= 2
    store.close()


def test_an_inline_ledger_writes_each_call_at_once_and_queues_one_its_store_refuses():
    """A ledger over a store held in this process (``inline``) writes a call in the
    caller's thread as it is recorded (the future it returns is done, nothing is queued or
    kept for a restore); a call the store refuses (busy) is queued, and the writer stores it
    once the store takes it."""
    from canopy.regional.store_memory import MemoryStore

    class Counting(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[tuple[str, int]] = []
            self.refuse = 0

        def add_calls(self, calls, ttl_s):
            self.batches.append((threading.current_thread().name, len(calls)))
            if self.refuse:
                self.refuse -= 1
                raise StoreBusy("busy")
            super().add_calls(calls, ttl_s)

    store = Counting()
    ledger = FeedbackLedger(store, reward=lambda q, c: q, chain=lambda r: [r], wait_s=30.0,
                            inline=True)
    here = threading.current_thread().name
    try:
        done = [ledger.record(_call(f"c{n}")) for n in range(5)]
        assert all(f.done() and f.result() is None for f in done)
        assert store.batches == [(here, 1)] * 5
        assert ledger.call("c3").id == "c3"
        assert ledger.rate("c1", 0.5).quality == 0.5
        assert ledger.restore() == 0  # nothing kept: the store lives as long as this process
        store.refuse = 2  # the inline write and the writer's first try
        queued = ledger.record(_call("late"))
        queued.result(timeout=30)
        assert ledger.call("late").id == "late"
    finally:
        ledger.close(timeout=30.0)
    assert [n for n, _ in store.batches[5:]] == [here, "canopy-ledger-writer",
                                                 "canopy-ledger-writer"]
