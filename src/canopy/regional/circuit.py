"""A circuit around a routing service's store: once the store cannot be reached, every call
fails at once (:class:`StoreDown`) instead of waiting on it, and a background thread probes
it until it answers. So with the store down a chat adds no store wait and a rating is
refused at once (a service answers 503 with ``Retry-After``, as for a busy store)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from canopy.regional.store import (
    Call,
    Cell,
    Changes,
    Increment,
    Store,
    StoreBusy,
    StoreUnreachable,
)
from canopy.validation import check_count, check_number

__all__ = ["StoreCircuit", "StoreDown"]

log = logging.getLogger("canopy.regional")

T = TypeVar("T")


class StoreDown(StoreBusy):
    """The store's circuit is open: the store was not called."""


class StoreCircuit:
    """``store`` behind a circuit: after ``failures`` calls in a row found it unreachable
    (:class:`~canopy.regional.store.StoreUnreachable`; a store merely locked or slow, or
    reset, is no failure: its callers retry) it opens; while open every call raises
    :class:`StoreDown` without touching the store, and the thread ``canopy-store-probe``
    tries :meth:`Store.ping` every ``probe_s`` seconds, closing the circuit on the first
    answer. A :class:`Store` itself."""

    def __init__(self, store: Store, *, failures: int = 2, probe_s: float = 0.25) -> None:
        self.store = store
        self.failures = check_count(failures, "failures")
        self.probe_s = check_number(probe_s, "probe_s", low=1e-3)
        self._streak = 0
        self._down = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._probe: threading.Thread | None = None
        self.opened = 0  # how many times the circuit opened

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def generation(self) -> str | None:
        return self.store.generation

    @property
    def down(self) -> bool:
        """Whether the circuit is open (calls fail at once)."""
        return self._down.is_set()

    def _call(self, method: Callable[..., T], *args: object) -> T:
        if self._down.is_set():
            raise StoreDown(f"the store {self.url} is down (probed every {self.probe_s:g} s)")
        try:
            result = method(*args)
        except StoreUnreachable:
            self._failed()
            raise
        with self._lock:
            self._streak = 0
        return result

    def _failed(self) -> None:
        with self._lock:
            self._streak += 1
            if self._streak < self.failures or self._down.is_set() or self._closing.is_set():
                return
            self._down.set()
            self.opened += 1
            self._probe = threading.Thread(target=self._probe_loop, daemon=True,
                                           name="canopy-store-probe")
            self._probe.start()
        log.warning("the store %s failed %d times in a row: calls fail at once until it "
                    "answers a probe", self.url, self.failures)

    def _probe_loop(self) -> None:
        while not self._closing.wait(self.probe_s):
            try:
                self.store.ping()
            except StoreUnreachable:
                continue
            except StoreBusy:  # locked or slow, but there
                pass
            except Exception:  # the probe must outlive any one failure
                log.exception("probing the store %s failed", self.url)
                continue
            with self._lock:
                self._streak = 0
                self._down.clear()
            log.warning("the store %s answers again", self.url)
            return

    # -- the protocol, through the circuit ---------------------------------------------------
    def check_meta(self, models: Sequence[str], lam: float) -> None:
        self._call(self.store.check_meta, models, lam)

    def reseed(self, cells: Sequence[Cell], cost_max: float) -> bool:
        return self._call(self.store.reseed, cells, cost_max)

    def ping(self) -> None:
        self._call(self.store.ping)

    def add_calls(self, calls: Sequence[Call], ttl_s: float) -> None:
        self._call(self.store.add_calls, calls, ttl_s)

    def calls(self, ids: Sequence[str]) -> list[Call | None]:
        return self._call(self.store.calls, ids)

    def episode(self, episode: str) -> list[Call]:
        return self._call(self.store.episode, episode)

    def rate(self, ids: Sequence[str], quality: float, increments: Sequence[Increment],
             cost_max: float) -> bool:
        return self._call(self.store.rate, ids, quality, increments, cost_max)

    def changes(self, since: int) -> Changes:
        return self._call(self.store.changes, since)

    def rated_since(self, version: int) -> list[str] | None:
        return self._call(self.store.rated_since, version)

    def expire(self, older_than: float) -> int:
        return self._call(self.store.expire, older_than)

    def counts(self) -> dict[str, int]:
        return self._call(self.store.counts)

    def namespaces(self, prefix: str) -> dict[str, list[str]]:
        return self._call(self.store.namespaces, prefix)

    def close(self) -> None:
        """Stop probing and close the store."""
        self._closing.set()
        if self._probe is not None:
            self._probe.join(timeout=5)
        self.store.close()
