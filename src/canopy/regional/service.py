"""The routing service: a regional router, one feedback ledger and one circuit breaker over
a store that several processes may share (paper Section 4, "Routing", as a service). It owns
the routing decision; the routing proxy and the LiteLLM strategy are thin adapters that call
its public methods: :meth:`RoutingService.route` (a request's region and the models to try,
best first), :meth:`~RoutingService.outcome` (how a model's call went, for the breaker),
:meth:`~RoutingService.record` and :meth:`~RoutingService.rate` (a call and its rating).

Routing never touches the store: :meth:`RoutingService.route` reads the router in memory,
under a lock held for microseconds. A background thread pulls the cells that any process
changed (every ``sync_s``, 0.25 s by default) and writes their moments into the router, so
every worker ranks with every worker's ratings within about a second; it also forgets the
calls past the feedback window. A rating is stored first (one atomic step) and reaches this
process's router at once, the others' at their next pull. An outcome that awaits no rating
(:meth:`RoutingService.observe`: a gateway's time to first token under a trade-off) is learnt
here at once and added to the store at the next pull, ahead of the read, so it reaches the
other processes within ``sync_s`` or so. Statistics the router held when
the service was built (a warm start) are kept as a prior under the stored sums.

The store sits behind a circuit (:class:`~canopy.regional.circuit.StoreCircuit`): a store
that is down fails at once and is probed in the background. A store found restarted empty or
replaced (:class:`~canopy.regional.store.StoreReset`) is re-seeded from the sums this process
last read (one process does it, under the store's lock; the others adopt it), and the calls
awaiting a rating are stored again (those rated through another process are forgotten at each
pull): at most the ratings of the last ``sync_s`` are lost, and a call rated through another
process in that last ``sync_s`` could be rated once more.

The service chooses a *model*; which replica of that model's upstream serves the call is the
adapter's to ask of the upstream, after the choice (the proxy's
:class:`~canopy.apps.routing.proxy.upstreams.UpstreamPool`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np

from canopy.regional.breaker import Breaker
from canopy.regional.circuit import StoreCircuit
from canopy.regional.ledger import FeedbackLedger, UnknownCall
from canopy.regional.router import RegionalRouter
from canopy.regional.sources import RegionSource
from canopy.regional.store import Call, Cell, Changes, Store, StoreBusy, StoreReset, moments
from canopy.regional.stores import open_store
from canopy.validation import check_nonnegative

__all__ = ["Route", "RoutingService"]

log = logging.getLogger("canopy.regional")

T = TypeVar("T")
_ONE_MODEL = np.zeros(1)  # a one-model router's scores (read only)
_ONE_MODEL.flags.writeable = False


class Route(NamedTuple):
    """A request's routing decision: its region and the models to try, best first (the
    breaker's ejected ones last)."""

    region: str
    ranking: tuple[str, ...]


class _Held:
    """``with`` it: ``lock`` held, ``value`` given (a class, not a generator: it is entered
    on every request)."""

    def __init__(self, lock: Any, value: Any) -> None:
        self._lock, self._value = lock, value

    def __enter__(self) -> Any:
        self._lock.acquire()
        return self._value

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class RoutingService:
    """``router`` (its models are the arms; it holds the trade-off ``lam``) over ``store``
    (a :class:`Store` or a URL for :func:`~canopy.regional.stores.open_store`;
    ``namespace`` separates services sharing a store). ``regions`` says where a request's
    region comes from (default: the region it names, else the root). ``window_s``: how long
    a call accepts its rating; ``breaker_failures`` and ``breaker_cooldown_s``: the circuit
    breaker; ``sync_s``: how often the store is read (``0``: only on :meth:`sync`);
    ``expire_every_s``: how often calls past the window are forgotten (default: every
    minute, or every half window when that is shorter); ``wait_s``: how long one store
    operation, or a rating of a call not yet stored, waits. ``shared_store``: whether
    another process (or service) may read the store: false only for a ``"memory"`` store
    opened here from its URL, whose calls are then written at once in the caller's thread
    (:class:`~canopy.regional.ledger.FeedbackLedger`'s ``inline``: a dictionary's write, no
    queue or thread per call)."""

    def __init__(self, router: RegionalRouter, store: Store | str = "memory", *,
                 regions: RegionSource | None = None, namespace: str = "",
                 window_s: float = 7 * 24 * 3600.0, breaker_failures: int = 3,
                 breaker_cooldown_s: float = 30.0, sync_s: float = 0.25,
                 expire_every_s: float | None = None, wait_s: float = 1.0,
                 max_queued: int = 100_000) -> None:
        self.router = router
        self.shared_store = store != "memory"
        self.store = StoreCircuit(open_store(store, namespace=namespace, wait_s=wait_s)
                                  if isinstance(store, str) else store)
        self.store.check_meta(router.models, router.lam)
        self.regions = RegionSource() if regions is None else regions
        self._lock = threading.RLock()
        self._reading = _Held(self._lock, router)
        self._prior = self._sums()
        self._version = 0
        self._rated_from = 0  # the version after which ratings elsewhere are to be read
        self._cells: dict[tuple[str, str], np.ndarray] = {}  # the store's sums, as last read
        self._cost_max = 0.0
        self._grace = max(5.0, 8 * sync_s)  # after a re-seed: the others store their calls
        self._reseeded_at = -float("inf")
        self._sync_lock = threading.Lock()
        self._mean_cost: dict[str, tuple[int, float]] = {}  # model -> (calls, mean cost)
        self._ledger = FeedbackLedger(self.store, reward=router.reward,
                                      chain=self.chain_paths, window_s=window_s,
                                      max_queued=max_queued, wait_s=wait_s,
                                      inline=not self.shared_store)
        self._breaker = Breaker(breaker_failures, breaker_cooldown_s)
        self._sync_quietly()
        self._rated_from = self._version  # every call here is stored (and rated) after it
        self._stop = threading.Event()
        self._thread = None
        if expire_every_s is None:
            expire_every_s = min(60.0, window_s / 2)
        if sync_s > 0:
            self._thread = threading.Thread(target=self._loop, args=(sync_s, expire_every_s),
                                            daemon=True, name="canopy-service-sync")
            self._thread.start()

    @property
    def models(self) -> tuple[str, ...]:
        return self.router.models

    @property
    def lam(self) -> float:
        """The router's price of cost in quality units per dollar (its one place)."""
        return self.router.lam

    # -- routing ---------------------------------------------------------------------------
    def route(self, given: str | None = None, body: dict[str, Any] | None = None, *,
              allowed: Collection[str] | None = None, lam: float | None = None,
              costs: Mapping[str, float] | None = None, max_cost: float | None = None
              ) -> Route:
        """The decision for one request: its region (:meth:`region`) and the models to try
        in it, best first (:meth:`ranking`; ``allowed``, ``lam``, ``costs`` and
        ``max_cost`` as there; a router of one model is not asked for its indices). Raises
        ``ValueError`` for a malformed region path."""
        path = self.regions.propose(given, body)  # a classifier may be slow: no lock
        with self._lock:
            region = self.regions.bound(path, self.router.regions)
            if len(self.models) == 1:  # nothing to rank: only the region's node is made
                self.router.chain(region)
                scores = _ONE_MODEL
            else:
                scores = self.router.scores(region)
        return Route(region, self._order(scores, allowed, lam, costs, max_cost))

    def region(self, given: str | None = None, body: dict[str, Any] | None = None) -> str:
        """A request's region: ``given`` (a header, request metadata), else what the
        :class:`~canopy.regional.sources.RegionSource` reads in ``body``, held to its
        bounds (``ValueError`` for a malformed path). Creates nothing."""
        path = self.regions.propose(given, body)
        with self._lock:
            return self.regions.bound(path, self.router.regions)

    def scores(self, region: str) -> np.ndarray:
        """Each model's index in ``region`` (higher first), from memory."""
        with self._lock:
            return self.router.scores(region)

    def ranking(self, region: str, allowed: Collection[str] | None = None, *,
                lam: float | None = None, costs: Mapping[str, float] | None = None,
                max_cost: float | None = None) -> tuple[str, ...]:
        """Models by index in ``region``, the breaker's ejected ones last; only ``allowed``
        if given. A request's own ``lam`` re-weighs each model's index by the difference in
        cost weight times the model's mean cost so far (before its first recorded call:
        ``costs[model]``, this request's estimate); ``max_cost`` drops the models whose
        ``costs`` (this request's estimated cost per model, then required) exceed it."""
        return self._order(self.scores(region), allowed, lam, costs, max_cost)

    def _order(self, scores: np.ndarray, allowed: Collection[str] | None, lam: float | None,
               costs: Mapping[str, float] | None, max_cost: float | None
               ) -> tuple[str, ...]:
        models = self.models
        keep = None if allowed is None else set(allowed)
        if lam is not None or max_cost is not None:
            estimate = np.zeros(len(models)) if costs is None else \
                np.array([costs[m] for m in models], dtype=float)
            if lam is not None:
                with self._lock:
                    seen = np.array([self._mean_cost.get(m, (0, c))[1]
                                     for m, c in zip(models, estimate, strict=True)])
                scores = scores + (self.lam - check_nonnegative(lam, "lam")) * seen
            if max_cost is not None:
                if costs is None:
                    raise ValueError("max_cost needs each model's estimated cost (costs)")
                within = estimate <= check_nonnegative(max_cost, "max_cost")
                keep = {m for m, ok in zip(models, within, strict=True) if ok and
                        (keep is None or m in keep)}
        ranked = list(models) if len(models) == 1 else \
            [models[int(m)] for m in np.argsort(-scores, kind="stable")]
        if keep is not None:
            ranked = [m for m in ranked if m in keep]
        return tuple(self._breaker.order(ranked))

    def outcome(self, model: str, ok: bool) -> None:
        """How a call to ``model`` went (answered, or failed through the upstream's fault):
        the circuit breaker sets a model that keeps failing aside for a cool-down."""
        if ok:
            self._breaker.success(model)
        else:
            self._breaker.failure(model)

    def ejected(self) -> list[str]:
        """The models the breaker has set aside now."""
        return self._breaker.ejected()

    def chain_paths(self, region: str) -> list[str]:
        with self._lock:
            return self.router.chain_paths(region)

    # -- calls and ratings -----------------------------------------------------------------
    def record(self, call: Call) -> concurrent.futures.Future[None]:
        """Keep an answered call for its rating (written in the background), and its cost in
        its model's mean cost (what a request's own ``lam`` re-weighs by)."""
        with self._lock:
            n, mean = self._mean_cost.get(call.model, (0, 0.0))
            self._mean_cost[call.model] = (n + 1, mean + (call.cost - mean) / (n + 1))
        return self._ledger.record(call)

    def call(self, call_id: str) -> Call | None:
        """The call of ``call_id`` awaiting (or given) its rating; ``None`` when unknown or
        forgotten. Raises ``StoreBusy`` (also while the call waits to be stored)."""
        return self._ledger.call(call_id)

    def rate(self, call_id: str, quality: float) -> Call:
        """Store a rating, then use it here; the call, rated (see
        :meth:`FeedbackLedger.rate` for what is refused, as a ``FeedbackError``)."""
        call = self._rate_through_reset(self._ledger.rate, call_id, quality)
        self._sync_quietly()
        return call

    def rate_episode(self, episode: str, reward: float) -> list[Call]:
        """Store an episode's reward, then use it here (:meth:`FeedbackLedger.rate_episode`)."""
        calls = self._rate_through_reset(self._ledger.rate_episode, episode, reward)
        self._sync_quietly()
        return calls

    def _rate_through_reset(self, rate: Callable[[str, float], T], key: str, value: float
                            ) -> T:
        """``rate(key, value)``, once more after re-seeding (or adopting) a store found reset;
        an unknown call soon after a re-seed is ``StoreBusy`` (retry): the process that made
        it may not have stored it again yet."""
        try:
            try:
                return rate(key, value)
            except StoreReset:
                self.sync()
                return rate(key, value)
        except UnknownCall:
            if time.monotonic() - self._reseeded_at < self._grace:
                raise StoreBusy(f"{key!r} is unknown to the store re-seeded moments ago: "
                                "its calls are being stored again") from None
            raise

    def observe(self, region: str, model: str, quality: float, cost: float) -> None:
        """An outcome that awaits no rating: learnt here at once
        (``RegionalRouter.update``, which checks it), and added to the store at the next
        pull, whose read then overwrites these cells with the sums every process wrote (this
        outcome among them: never counted twice). Never waits on the store."""
        with self._lock:
            self.router.update(region, model, quality, cost)
        self._ledger.observe(region, model, quality, cost)

    def reading(self) -> contextlib.AbstractContextManager[RegionalRouter]:
        """The router, held: no pull writes into it until the block ends (for a host that
        reads its tables itself, as a gateway's replica policy does, once a request)."""
        return self._reading

    def reward(self, quality: float, cost: float) -> float:
        """The router's reward of an outcome, ``quality - lam * cost``."""
        return self.router.reward(quality, cost)

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
        """Add the outcomes waiting to be stored (:meth:`observe`), then read the cells
        changed in the store since the last read into the router; how many. A store
        restarted empty or replaced is re-seeded first (``_reseed``). Then forget the calls
        awaiting a rating here that another process rated since the last pull
        (:meth:`FeedbackLedger.forget_rated`). Raises ``StoreBusy``."""
        read = self._pull()
        with self._sync_lock:
            if self._version > self._rated_from:
                upto = self._version
                self._ledger.forget_rated(self._rated_from)
                self._rated_from = upto
        return read

    def _pull(self) -> int:
        """:meth:`sync` but for the calls rated elsewhere (what a rating's own read skips)."""
        with self._sync_lock:
            try:
                self._ledger.flush()
                changes: Changes = self.store.changes(self._version)
                reset, gone = False, set[tuple[str, str]]()
            except StoreReset:
                changes = self._reseed()
                reset, gone = True, set(self._cells)  # not in the store: back to the prior
            known = set(self.models)
            with self._lock:
                for cell in changes.cells:
                    if cell.model not in known:
                        continue  # a deployment this router no longer has
                    key = (cell.region, cell.model)
                    gone.discard(key)
                    self._cells[key] = np.array([cell.n, cell.s, cell.q])
                    self._set_moments(key, changes.cost_max)
                for key in gone:
                    del self._cells[key]
                    self._set_moments(key, changes.cost_max)
            self._cost_max = max(self._cost_max, changes.cost_max)
            self._version = changes.version if reset else max(self._version, changes.version)
            if reset:  # the new store's ratings, from its first
                self._rated_from = 0
            return len(changes.cells)

    def _set_moments(self, key: tuple[str, str], cost_max: float) -> None:
        """The router's moments of ``key``: the store's sums over the prior (under the lock)."""
        sums = self._cells.get(key, np.zeros(3)) + self._prior.get(key, np.zeros(3))
        self.router.set_moments(*key, *moments(*sums), cost_max=cost_max)

    def _reseed(self) -> Changes:
        """The store restarted empty or was replaced: add the sums this process last read
        to it, unless another process did so first (then adopt what it wrote); store again
        the calls awaiting a rating; the store's cells, all of them (under the sync lock)."""
        cells = [Cell(region, model, *map(float, sums))
                 for (region, model), sums in self._cells.items()]
        first = self.store.reseed(cells, self._cost_max)
        self.store.check_meta(self.models, self.lam)
        restored = self._ledger.restore()
        self._reseeded_at = time.monotonic()
        log.warning("the store %s was restarted empty or replaced: %s; %d calls awaiting a "
                    "rating stored again", self.store.url,
                    f"re-seeded with {len(cells)} cells" if first else
                    "adopted the sums another process re-seeded", restored)
        return self.store.changes(0)

    def _sync_quietly(self) -> None:
        try:
            self._pull()
        except StoreBusy as error:  # stored: the background pull will bring it
            log.info("reading the store after a rating: %s", error)

    def _loop(self, sync_s: float, expire_every_s: float) -> None:
        next_expiry = time.monotonic()
        while not self._stop.wait(sync_s):
            try:
                self.sync()
                if expire_every_s > 0 and time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + expire_every_s
                    gone = self._ledger.expire()
                    if gone:
                        log.info("forgot %d calls past the feedback window", gone)
            except StoreBusy as error:
                log.warning("the store is busy: %s", error)
            except Exception:  # the thread must outlive any one failure
                log.exception("syncing with the store failed")

    def estimates(self) -> list[dict[str, Any]]:
        """The router's estimates for every region holding data, by region path then model:
        an order that depends on what was learned, not on the order regions were met."""
        with self._lock:
            rows = self.router.estimates()
        held = {row["region"] for row in rows if row["count"] > 0}
        index = {m: i for i, m in enumerate(self.models)}
        return sorted((row for row in rows if row["region"] in held),
                      key=lambda row: (row["region"], index[row["model"]]))

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    def close(self, *, store: bool = True) -> None:
        """Stop the pulls, store what is queued and observed, and close the store (unless
        ``store`` is false: another service goes on with it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._ledger.flush()
        except StoreBusy as error:
            log.warning("outcomes not stored at shutdown: %s", error)
        self._ledger.close()
        if store:
            self.store.close()
