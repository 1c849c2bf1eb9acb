"""The routing service: a regional router, one feedback ledger and one circuit breaker over
a store that several processes may share (paper Section 5, "Routing", as a service). The
routing proxy and the LiteLLM strategy are thin adapters over it.

Routing never touches the store: :meth:`RoutingService.scores` reads the router in memory,
under a lock held for microseconds. A background thread pulls the cells that any process
changed (every ``sync_s``, 0.25 s by default) and writes their moments into the router, so
every worker ranks with every worker's ratings within about a second; it also forgets the
calls past the feedback window. A rating is stored first (one atomic step) and reaches this
process's router at once, the others' at their next pull. Statistics the router held when
the service was built (a warm start) are kept as a prior under the stored sums.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Sequence

import numpy as np

from canopy.regional.breaker import Breaker
from canopy.regional.ledger import FeedbackLedger
from canopy.regional.router import RegionalRouter
from canopy.regional.store import Call, Changes, Store, StoreBusy, moments, open_store

__all__ = ["RoutingService"]

log = logging.getLogger("canopy.regional")


class RoutingService:
    """``router`` (its models are the arms) over ``store`` (a :class:`Store` or a URL for
    :func:`~canopy.regional.store.open_store`; ``namespace`` separates services sharing a
    store). ``window_s``: how long a call accepts its rating; ``breaker_failures`` and
    ``breaker_cooldown_s``: the circuit breaker; ``sync_s``: how often the store is read
    (``0``: only on :meth:`sync`); ``expire_every_s``: how often old calls are forgotten."""

    def __init__(self, router: RegionalRouter, store: Store | str = "memory", *,
                 namespace: str = "", window_s: float = 7 * 24 * 3600.0,
                 breaker_failures: int = 3, breaker_cooldown_s: float = 30.0,
                 sync_s: float = 0.25, expire_every_s: float = 60.0, wait_s: float = 1.0,
                 max_queued: int = 100_000) -> None:
        self.router = router
        self.store = open_store(store, namespace=namespace, wait_s=wait_s) \
            if isinstance(store, str) else store
        self.store.check_meta(router.models, router.lam)
        self.lock = threading.RLock()
        self._prior = self._sums()
        self._version = 0
        self._sync_lock = threading.Lock()
        self.ledger = FeedbackLedger(self.store, lam=router.lam, chain=self.chain_paths,
                                     window_s=window_s, max_queued=max_queued)
        self.breaker = Breaker(breaker_failures, breaker_cooldown_s)
        self.sync()
        self._stop = threading.Event()
        self._thread = None
        if sync_s > 0:
            self._thread = threading.Thread(target=self._loop, args=(sync_s, expire_every_s),
                                            daemon=True, name="canopy-service-sync")
            self._thread.start()

    @property
    def models(self) -> tuple[str, ...]:
        return self.router.models

    @property
    def lam(self) -> float:
        return self.router.lam

    # -- routing ---------------------------------------------------------------------------
    def scores(self, region: str) -> np.ndarray:
        """Each model's index in ``region`` (higher first), from memory."""
        with self.lock:
            return self.router.scores(region)

    def ranking(self, region: str, allowed: Sequence[str] | None = None) -> list[str]:
        """Models by index, the breaker's ejected ones last; only ``allowed`` if given."""
        order = np.argsort(-self.scores(region), kind="stable")
        ranked = [self.models[int(m)] for m in order]
        if allowed is not None:
            keep = set(allowed)
            ranked = [m for m in ranked if m in keep]
        return self.breaker.order(ranked)

    def chain_paths(self, region: str) -> list[str]:
        with self.lock:
            return self.router.chain_paths(region)

    # -- calls and ratings -----------------------------------------------------------------
    def record(self, call: Call) -> concurrent.futures.Future[None]:
        """Keep an answered call for its rating (written in the background)."""
        return self.ledger.record(call)

    def rate(self, call_id: str, quality: float) -> Call:
        """Store a rating, then use it here (see :meth:`FeedbackLedger.rate`)."""
        call = self.ledger.rate(call_id, quality)
        self._sync_quietly()
        return call

    def rate_episode(self, episode: str, reward: float) -> list[Call]:
        """Store an episode's reward, then use it here (:meth:`FeedbackLedger.rate_episode`)."""
        calls = self.ledger.rate_episode(episode, reward)
        self._sync_quietly()
        return calls

    # -- the shared statistics -------------------------------------------------------------
    def _sums(self) -> dict[tuple[str, str], np.ndarray]:
        """The router's moments as sums ``(n, s, q)`` per (region, model) with data."""
        state = self.router.state()
        out = {}
        for path, row in zip(state["regions"], state["stats"], strict=True):
            for model, (count, mean, m2) in zip(self.models, row, strict=True):
                if count > 0:
                    out[(path, model)] = np.array([count, count * mean, m2 + count * mean**2])
        return out

    def sync(self) -> int:
        """Read the cells changed in the store since the last read into the router; how
        many. Raises ``StoreBusy``."""
        with self._sync_lock:
            changes: Changes = self.store.changes(self._version)
            known = set(self.models)
            with self.lock:
                for cell in changes.cells:
                    if cell.model not in known:
                        continue  # a deployment this router no longer has
                    sums = np.array([cell.n, cell.s, cell.q])
                    prior = self._prior.get((cell.region, cell.model))
                    if prior is not None:
                        sums = sums + prior
                    self.router.set_moments(cell.region, cell.model, *moments(*sums),
                                            cost_max=changes.cost_max)
            self._version = max(self._version, changes.version)
            return len(changes.cells)

    def _sync_quietly(self) -> None:
        try:
            self.sync()
        except StoreBusy as error:  # stored: the background pull will bring it
            log.info("reading the store after a rating: %s", error)

    def _loop(self, sync_s: float, expire_every_s: float) -> None:
        next_expiry = time.monotonic()
        while not self._stop.wait(sync_s):
            try:
                self.sync()
                if expire_every_s > 0 and time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + expire_every_s
                    gone = self.ledger.expire()
                    if gone:
                        log.info("forgot %d calls past the feedback window", gone)
            except StoreBusy as error:
                log.warning("the store is busy: %s", error)
            except Exception:  # the thread must outlive any one failure
                log.exception("syncing with the store failed")

    def estimates(self) -> list[dict[str, object]]:
        """The router's estimates for every region holding data, by region path then model:
        an order that depends on what was learned, not on the order regions were met."""
        with self.lock:
            rows = self.router.estimates()
        held = {row["region"] for row in rows if row["count"] > 0}
        index = {m: i for i, m in enumerate(self.models)}
        return sorted((row for row in rows if row["region"] in held),
                      key=lambda row: (row["region"], index[row["model"]]))

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.ledger.close()
        self.store.close()
