"""Where a routing service keeps what it learns: the calls awaiting a rating and, per
(region, model), the sums the router's moments come from. Three stores share this protocol:
:class:`~canopy.regional.store_memory.MemoryStore` (one process),
:class:`~canopy.regional.store_sqlite.SqliteStore` (one machine, the default) and
:class:`~canopy.regional.store_redis.RedisStore` (many workers and machines).

A cell holds ``(n, s, q)``: the weight, the weighted sum and the weighted sum of squares of
the rewards ``quality - lam * cost`` (paper Section 4, "Routing") taken at that node of the
region tree. Sums add, so any number of processes may add to one cell in any order; each
reads back the moments ``(count, mean, m2)`` the kernels work with (:func:`moments`).

Every write is one atomic step: :meth:`Store.rate` marks a set of calls rated and adds their
rewards together, or (a call already rated) changes nothing. A store that cannot answer
within its wait raises :class:`StoreBusy`; callers degrade (retry later), never block.

A store keeps a *generation* marker: ``fresh:<token>`` when a process found it empty,
``seeded:<token>`` once a process re-seeded it (:meth:`Store.reseed`). A store restarted
empty (Redis run without persistence) or replaced (a SQLite file deleted and re-created)
has lost or changed its marker; every read and rating then raises :class:`StoreReset` until
the process re-seeds it or adopts the re-seeded one.

A store also keeps, for the last :data:`RATED_KEPT` versions, the ids of the calls each
rating marked (:meth:`Store.rated_since`): how a process learns, at its pull, which of the
calls it made were rated through another process, so that after a reset it stores again
only the calls still awaiting a rating.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from canopy._lazy import deprecated_aliases

__all__ = ["RATED_KEPT", "Call", "Cell", "Changes", "Increment", "Store", "StoreBusy",
           "StoreReset", "StoreUnreachable", "moments", "new_marker", "seeded"]

RATED_KEPT = 10_000
"""How many versions back a store keeps the ids its ratings marked (each rating is one
version, so at most this many ratings' ids): a process whose last pull is older looks its
calls up one by one instead."""


class StoreBusy(Exception):
    """The store did not answer within its wait (locked, unreachable); nothing was written."""


class StoreUnreachable(StoreBusy):
    """The store could not be reached at all (refused, gone, its file unopenable), not merely
    slow or locked: what opens the store's circuit
    (:class:`~canopy.regional.circuit.StoreCircuit`)."""


class StoreReset(StoreBusy):
    """The store is not the one this process knew (its generation marker is gone or another):
    nothing was written; re-seed it or adopt it (:meth:`Store.reseed`), then read it all."""


@dataclass(frozen=True)
class Call:
    """A routed call awaiting its rating: where it was routed, to which model, at what cost,
    when (epoch seconds), its episode (or ``None``) and its rating once given."""

    id: str
    region: str
    model: str
    cost: float
    created: float
    episode: str | None = None
    quality: float | None = None


@dataclass(frozen=True)
class Increment:
    """``weight`` observations of ``reward`` added to ``model`` at region ``region``."""

    region: str
    model: str
    weight: float
    reward: float


@dataclass(frozen=True)
class Cell:
    """The sums of one (region, model): weight ``n``, ``s = sum w r``, ``q = sum w r^2``."""

    region: str
    model: str
    n: float
    s: float
    q: float


@dataclass(frozen=True)
class Changes:
    """What changed since a version: the store's version now, the cells written after the
    given version (their full sums), and the largest cost rated so far."""

    version: int
    cells: tuple[Cell, ...]
    cost_max: float


def new_marker(seeded: bool) -> str:
    """A generation marker never used before: ``seeded:<token>`` or ``fresh:<token>``."""
    return f"{'seeded' if seeded else 'fresh'}:{uuid.uuid4().hex}"


def seeded(marker: str | None) -> bool:
    """Whether a store's marker says a process re-seeded it since it was found empty."""
    return marker is not None and marker.startswith("seeded:")


def moments(n: float, s: float, q: float) -> tuple[float, float, float]:
    """``(count, mean, m2)`` of a cell's sums (``m2`` is clipped at 0 against rounding)."""
    if n <= 0:
        return 0.0, 0.0, 0.0
    mean = s / n
    return n, mean, max(q - s * mean, 0.0)


@runtime_checkable
class Store(Protocol):
    """What a routing service needs of its store. Methods may raise :class:`StoreBusy`."""

    @property
    def url(self) -> str:
        """Where the store is (as a URL)."""

    @property
    def generation(self) -> str | None:
        """The marker this process knows the store by (adopted by :meth:`check_meta`)."""

    def check_meta(self, models: Sequence[str], lam: float) -> None:
        """Record which router the statistics belong to, or refuse (``ValueError``) when the
        store holds statistics taken at another ``lam``; adopt the store's generation (a
        fresh one if it has none)."""

    def reseed(self, cells: Sequence[Cell], cost_max: float) -> bool:
        """In one atomic step (under the store's lock): if no process re-seeded the store
        since it lost its marker, add ``cells`` to its sums and mark it re-seeded; adopt the
        store's marker either way. Whether this call re-seeded it."""

    def ping(self) -> None:
        """Return when the store could take a write now; else raise :class:`StoreBusy`."""

    def add_calls(self, calls: Sequence[Call], ttl_s: float) -> None:
        """Keep ``calls`` (new ids) for at least ``ttl_s`` seconds."""

    def calls(self, ids: Sequence[str]) -> list[Call | None]:
        """The calls of ``ids`` (``None`` for an unknown or expired id)."""

    def episode(self, episode: str) -> list[Call]:
        """The calls of an episode, oldest first."""

    def rate(self, ids: Sequence[str], quality: float, increments: Sequence[Increment],
             cost_max: float) -> bool:
        """In one atomic step: mark every call of ``ids`` rated ``quality`` and add
        ``increments``; ``False`` (nothing written) when one of them is rated or gone. With
        no ``ids``: add ``increments`` (outcomes that await no rating)."""

    def changes(self, since: int) -> Changes:
        """The cells written after version ``since`` (0: all)."""

    def rated_since(self, version: int) -> list[str] | None:
        """The ids of the calls marked rated at a version after ``version``; ``None`` when
        ``version`` is more than :data:`RATED_KEPT` versions behind the store's (their ids
        are no longer all kept)."""

    def expire(self, older_than: float) -> int:
        """Forget calls created before ``older_than`` (epoch seconds); how many."""

    def counts(self) -> dict[str, int]:
        """``{"requests": calls kept, "with_feedback": those rated}``."""

    def namespaces(self, prefix: str) -> dict[str, list[str]]:
        """Every namespace of this store starting with ``prefix``, with the models its
        statistics belong to (how a process that routed nothing finds what to rate)."""

    def close(self) -> None: ...


deprecated_aliases(__name__, {"open_store": "canopy.regional.stores"})
