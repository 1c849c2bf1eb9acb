"""SQLite persistence of the proxy: the router's learned statistics (one row per region and
model) and every answered request awaiting feedback, so a restart keeps what was learned.

WAL mode, one connection per process (several workers may share the file: SQLite's locks
serialise their writes). A feedback is one transaction: the request is marked rated only if
it was not already, and only the rows the outcome touches (its region's chain, its model) are
written; the caller updates its in-memory router after the commit, so a failed write changes
nothing and a retry counts once.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["AlreadyRated", "FeedbackWrite", "ProxyState", "RequestRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stats (
    region TEXT NOT NULL, position INTEGER NOT NULL, model TEXT NOT NULL,
    count REAL NOT NULL, mean REAL NOT NULL, m2 REAL NOT NULL,
    PRIMARY KEY (region, model));
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY, region TEXT NOT NULL, model TEXT NOT NULL, cost REAL NOT NULL,
    created REAL NOT NULL, quality REAL, episode TEXT);
CREATE INDEX IF NOT EXISTS requests_created ON requests (created);
"""
_EPISODES = """
CREATE INDEX IF NOT EXISTS requests_episode ON requests (episode) WHERE episode IS NOT NULL;
"""


class AlreadyRated(Exception):
    """The request already has its feedback."""


class FeedbackWrite:
    """The statistics of one feedback transaction (see :meth:`ProxyState.feedback`)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def read(self, regions: Sequence[str], model: str) -> np.ndarray:
        """``(count, mean, m2)`` of ``model`` in each region as stored now (zeros if none)."""
        out = np.zeros((len(regions), 3))
        for i, region in enumerate(regions):
            row = self._db.execute("SELECT count, mean, m2 FROM stats WHERE region = ? AND "
                                   "model = ?", (region, model)).fetchone()
            if row is not None:
                out[i] = row
        return out

    def write(self, model: str, rows: Sequence[tuple[int, str, float, float, float]],
              cost_max: float) -> None:
        """Store ``(position, region, count, mean, m2)`` rows of ``model``, and the largest
        cost seen."""
        self._db.executemany("INSERT OR REPLACE INTO stats VALUES (?, ?, ?, ?, ?, ?)",
                             [(path, position, model, count, mean, m2)
                              for position, path, count, mean, m2 in rows])
        self._db.execute("INSERT INTO meta VALUES ('cost_max', ?) ON CONFLICT(key) DO "
                         "UPDATE SET value = max(CAST(value AS REAL), excluded.value)",
                         (cost_max,))


@dataclass(frozen=True)
class RequestRecord:
    id: str
    region: str
    model: str
    cost: float
    created: float
    quality: float | None
    episode: str | None = None


_RECORD = "id, region, model, cost, created, quality, episode"


class ProxyState:
    """One SQLite file; safe across the proxy's threads and worker processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0,
                                   isolation_level=None)  # transactions are explicit
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(requests)")}
        if "episode" not in columns:  # a state file of an earlier version
            self._db.execute("ALTER TABLE requests ADD COLUMN episode TEXT")
        self._db.executescript(_EPISODES)

    def load_router_state(self) -> dict[str, object] | None:
        """The saved router state (as :meth:`RegionalRouter.state` gives it), or ``None``."""
        with self._lock:
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            rows = self._db.execute("SELECT region, position, model, count, mean, m2 FROM stats"
                                    " ORDER BY position").fetchall()
        rows.sort(key=lambda row: (row[0].count("/") + bool(row[0]), row[1]))  # parents first
        if "models" not in meta:
            return None
        models = meta["models"].split("\n")
        regions: dict[str, int] = {"": 0}
        cells: dict[tuple[str, str], list[float]] = {}
        for region, _, model, count, mean, m2 in rows:
            regions.setdefault(region, len(regions))
            cells[(region, model)] = [count, mean, m2]
        stats = [[cells.get((r, m), [0.0, 0.0, 0.0]) for m in models] for r in regions]
        return {"models": models, "lam": float(meta["lam"]), "regions": list(regions),
                "stats": stats, "cost_max": float(meta.get("cost_max", 0.0))}

    def save_meta(self, models: Sequence[str], lam: float) -> None:
        """Which router the statistics belong to (written once, at start)."""
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('models', ?)",
                             ("\n".join(models),))
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('lam', ?)", (repr(lam),))

    def add_request(self, request_id: str, region: str, model: str, cost: float,
                    episode: str | None = None) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT INTO requests VALUES (?, ?, ?, ?, ?, NULL, ?)",
                             (request_id, region, model, cost, time.time(), episode))

    def request(self, request_id: str) -> RequestRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_RECORD} FROM requests WHERE id = ?",
                                   (request_id,)).fetchone()
        return None if row is None else RequestRecord(*row)

    def mean_costs(self) -> dict[str, tuple[int, float]]:
        """Per model: how many requests are kept and their mean cost."""
        with self._lock:
            rows = self._db.execute("SELECT model, COUNT(*), AVG(cost) FROM requests "
                                    "GROUP BY model").fetchall()
        return {model: (int(n), float(mean)) for model, n, mean in rows}

    def episode(self, episode: str) -> list[RequestRecord]:
        """The calls of an episode, oldest first."""
        with self._lock:
            rows = self._db.execute(f"SELECT {_RECORD} FROM requests WHERE episode = ? "
                                    "ORDER BY created", (episode,)).fetchall()
        return [RequestRecord(*row) for row in rows]

    @contextlib.contextmanager
    def feedback(self, request_ids: Sequence[str], quality: float) -> Iterator[FeedbackWrite]:
        """One write transaction (``BEGIN IMMEDIATE``: workers take turns): marks every
        request of ``request_ids`` rated (``AlreadyRated`` if one was) and yields a
        :class:`FeedbackWrite` to read and write the touched statistics; commits on exit,
        rolls everything back on an error."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                marked = sum(self._db.execute("UPDATE requests SET quality = ? WHERE id = ? "
                                              "AND quality IS NULL", (quality, one)).rowcount
                             for one in request_ids)
                if marked != len(request_ids):
                    raise AlreadyRated(", ".join(request_ids))
                yield FeedbackWrite(self._db)
            except BaseException:
                self._db.rollback()
                raise
            self._db.commit()

    def expire(self, older_than: float) -> int:
        """Forget requests created before ``older_than`` (epoch seconds); how many."""
        with self._lock, self._db:
            return self._db.execute("DELETE FROM requests WHERE created < ?",
                                    (older_than,)).rowcount

    def counts(self) -> dict[str, int]:
        with self._lock:
            total, rated = self._db.execute(
                "SELECT COUNT(*), COUNT(quality) FROM requests").fetchone()
        return {"requests": int(total), "with_feedback": int(rated)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
