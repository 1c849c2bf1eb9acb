"""SQLite persistence of the proxy: the router's learned statistics (one row per region and
model) and every answered request awaiting feedback, so a restart keeps what was learned."""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProxyState", "RequestRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stats (
    region TEXT NOT NULL, position INTEGER NOT NULL, model TEXT NOT NULL,
    count REAL NOT NULL, mean REAL NOT NULL, m2 REAL NOT NULL,
    PRIMARY KEY (region, model));
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY, region TEXT NOT NULL, model TEXT NOT NULL, cost REAL NOT NULL,
    created REAL NOT NULL, quality REAL);
"""


@dataclass(frozen=True)
class RequestRecord:
    id: str
    region: str
    model: str
    cost: float
    quality: float | None


class ProxyState:
    """One SQLite file; safe across the proxy's threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
        with self._db:
            self._db.executescript(_SCHEMA)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints

    def load_router_state(self) -> dict[str, object] | None:
        """The saved router state (as :meth:`RegionalRouter.state` gives it), or ``None``."""
        with self._lock:
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            rows = self._db.execute("SELECT region, position, model, count, mean, m2 FROM stats"
                                    " ORDER BY position").fetchall()
        if "models" not in meta:
            return None
        models = meta["models"].split("\n")
        regions: list[str] = []
        cells: dict[tuple[str, str], list[float]] = {}
        for region, _, model, count, mean, m2 in rows:
            if region not in regions:
                regions.append(region)
            cells[(region, model)] = [count, mean, m2]
        stats = [[cells.get((r, m), [0.0, 0.0, 0.0]) for m in models] for r in regions]
        return {"models": models, "lam": float(meta["lam"]), "regions": regions or [""],
                "stats": stats or [[[0.0, 0.0, 0.0] for _ in models]]}

    def save_router_state(self, state: dict[str, object]) -> None:
        models = list(state["models"])
        rows = [(region, position, model, *state["stats"][position][m])
                for position, region in enumerate(state["regions"])
                for m, model in enumerate(models)]
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('models', ?)",
                             ("\n".join(models),))
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('lam', ?)",
                             (repr(float(state["lam"])),))
            self._db.executemany("INSERT OR REPLACE INTO stats VALUES (?, ?, ?, ?, ?, ?)", rows)

    def add_request(self, request_id: str, region: str, model: str, cost: float) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT INTO requests VALUES (?, ?, ?, ?, ?, NULL)",
                             (request_id, region, model, cost, time.time()))

    def request(self, request_id: str) -> RequestRecord | None:
        with self._lock:
            row = self._db.execute("SELECT id, region, model, cost, quality FROM requests "
                                   "WHERE id = ?", (request_id,)).fetchone()
        return None if row is None else RequestRecord(*row)

    def set_quality(self, request_id: str, quality: float) -> None:
        with self._lock, self._db:
            self._db.execute("UPDATE requests SET quality = ? WHERE id = ?",
                             (quality, request_id))

    def counts(self) -> dict[str, int]:
        with self._lock:
            total, rated = self._db.execute(
                "SELECT COUNT(*), COUNT(quality) FROM requests").fetchone()
        return {"requests": int(total), "with_feedback": int(rated)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
