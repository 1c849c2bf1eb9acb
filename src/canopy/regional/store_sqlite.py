"""The routing service's store in one SQLite file (:mod:`canopy.regional.store`): the
single-machine default, shared by every worker process on the machine.

WAL mode, so reads never wait for a writer; one connection per thread, each waiting at most
``wait_s`` for another writer's lock (then :class:`~canopy.regional.store.StoreBusy`). A
rating is one ``BEGIN IMMEDIATE`` transaction; a commit survives the process being killed.
A file written by the proxy's earlier layout (tables ``meta``, ``stats``, ``requests``) is
converted once, when first opened.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from canopy.regional.store import Call, Cell, Changes, Increment, StoreBusy

__all__ = ["SqliteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS canopy_meta (
    ns TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (ns, key));
CREATE TABLE IF NOT EXISTS canopy_cells (
    ns TEXT NOT NULL, region TEXT NOT NULL, model TEXT NOT NULL,
    n REAL NOT NULL, s REAL NOT NULL, q REAL NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (ns, region, model));
CREATE INDEX IF NOT EXISTS canopy_cells_version ON canopy_cells (ns, version);
CREATE TABLE IF NOT EXISTS canopy_calls (
    ns TEXT NOT NULL, id TEXT NOT NULL, region TEXT NOT NULL, model TEXT NOT NULL,
    cost REAL NOT NULL, created REAL NOT NULL, episode TEXT, quality REAL,
    PRIMARY KEY (ns, id));
CREATE INDEX IF NOT EXISTS canopy_calls_created ON canopy_calls (ns, created);
CREATE INDEX IF NOT EXISTS canopy_calls_episode ON canopy_calls (ns, episode)
    WHERE episode IS NOT NULL;
"""
class _Refused(Exception):
    """A call of a rating is already rated or gone: the transaction is rolled back."""


_CALL = "id, region, model, cost, created, episode, quality"


class SqliteStore:
    """One SQLite file; safe across threads and processes."""

    def __init__(self, path: str | Path, *, namespace: str = "", wait_s: float = 1.0) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.namespace = namespace
        self.wait_s = float(wait_s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        with self._busy():
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                _migrate(db, namespace)
            finally:
                db.close()

    # -- connections ---------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=self.wait_s, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a killed process
            self._local.db = db
            with self._all_lock:
                self._all.append(db)
        return db

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as error:
            raise StoreBusy(f"SQLite store {self.path}: {error}") from error

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        with self._busy():
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # -- the protocol --------------------------------------------------------------------
    def check_meta(self, models: Sequence[str], lam: float) -> None:
        with self._write() as db:
            row = db.execute("SELECT value FROM canopy_meta WHERE ns = ? AND key = 'lam'",
                             (self.namespace,)).fetchone()
            if row is not None and float(row[0]) != float(lam):
                raise ValueError(f"{self.path} holds statistics for lam={float(row[0])}, "
                                 f"not {lam}")
            db.executemany("INSERT OR REPLACE INTO canopy_meta VALUES (?, ?, ?)",
                           [(self.namespace, "lam", repr(float(lam))),
                            (self.namespace, "models", "\n".join(models))])

    def add_calls(self, calls: Sequence[Call], ttl_s: float) -> None:
        with self._write() as db:
            db.executemany("INSERT OR IGNORE INTO canopy_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(self.namespace, c.id, c.region, c.model, c.cost, c.created,
                             c.episode, c.quality) for c in calls])

    def calls(self, ids: Sequence[str]) -> list[Call | None]:
        db = self._db()
        out: list[Call | None] = []
        with self._busy():
            for one in ids:
                row = db.execute(f"SELECT {_CALL} FROM canopy_calls WHERE ns = ? AND id = ?",
                                 (self.namespace, one)).fetchone()
                out.append(None if row is None else Call(*row))
        return out

    def episode(self, episode: str) -> list[Call]:
        with self._busy():
            rows = self._db().execute(f"SELECT {_CALL} FROM canopy_calls WHERE ns = ? AND "
                                      "episode = ? ORDER BY created",
                                      (self.namespace, episode)).fetchall()
        return [Call(*row) for row in rows]

    def rate(self, ids: Sequence[str], quality: float, increments: Sequence[Increment],
             cost_max: float) -> bool:
        ns = self.namespace
        try:
            with self._write() as db:
                marked = sum(db.execute("UPDATE canopy_calls SET quality = ? WHERE ns = ? AND "
                                        "id = ? AND quality IS NULL",
                                        (quality, ns, one)).rowcount for one in ids)
                if marked != len(ids):
                    raise _Refused
                version = int(db.execute(
                    "INSERT INTO canopy_meta VALUES (?, 'version', '1') ON CONFLICT (ns, key) "
                    "DO UPDATE SET value = CAST(value AS INTEGER) + 1 RETURNING value", (ns,)
                ).fetchone()[0])
                db.executemany(
                    "INSERT INTO canopy_cells VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                    "(ns, region, model) DO UPDATE SET n = n + excluded.n, s = s + excluded.s,"
                    " q = q + excluded.q, version = excluded.version",
                    [(ns, i.region, i.model, i.weight, i.weight * i.reward,
                      i.weight * i.reward * i.reward, version) for i in increments])
                db.execute("INSERT INTO canopy_meta VALUES (?, 'cost_max', ?) ON CONFLICT "
                           "(ns, key) DO UPDATE SET value = max(CAST(value AS REAL), "
                           "excluded.value)", (ns, cost_max))
        except _Refused:
            return False
        return True

    def changes(self, since: int) -> Changes:
        db = self._db()
        with self._busy():
            db.execute("BEGIN")  # one snapshot: the version and the cells agree
            try:
                meta = dict(db.execute("SELECT key, value FROM canopy_meta WHERE ns = ? AND "
                                       "key IN ('version', 'cost_max')",
                                       (self.namespace,)).fetchall())
                rows = db.execute("SELECT region, model, n, s, q FROM canopy_cells WHERE "
                                  "ns = ? AND version > ?", (self.namespace, since)).fetchall()
            finally:
                db.execute("COMMIT")
        return Changes(int(meta.get("version", 0)), tuple(Cell(*row) for row in rows),
                       float(meta.get("cost_max", 0.0)))

    def expire(self, older_than: float) -> int:
        with self._write() as db:
            return db.execute("DELETE FROM canopy_calls WHERE ns = ? AND created < ?",
                              (self.namespace, older_than)).rowcount

    def counts(self) -> dict[str, int]:
        with self._busy():
            total, rated = self._db().execute(
                "SELECT COUNT(*), COUNT(quality) FROM canopy_calls WHERE ns = ?",
                (self.namespace,)).fetchone()
        return {"requests": int(total), "with_feedback": int(rated)}

    def close(self) -> None:
        with self._all_lock:
            for db in self._all:
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            self._all.clear()
        self._local = threading.local()


def _migrate(db: sqlite3.Connection, namespace: str) -> None:
    """Move an earlier layout's statistics and requests into this one's (once)."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "stats" not in tables:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("INSERT OR IGNORE INTO canopy_cells SELECT ?, region, model, count, "
                   "count * mean, m2 + count * mean * mean, 1 FROM stats", (namespace,))
        if "requests" in tables:
            db.execute("INSERT OR IGNORE INTO canopy_calls SELECT ?, id, region, model, cost, "
                       "created, episode, quality FROM requests", (namespace,))
        db.execute("INSERT OR IGNORE INTO canopy_meta SELECT ?, key, value FROM meta WHERE "
                   "key IN ('lam', 'models', 'cost_max')", (namespace,))
        db.execute("INSERT OR REPLACE INTO canopy_meta VALUES (?, 'version', '1')", (namespace,))
        db.execute("DROP TABLE stats")
        db.execute("DROP TABLE IF EXISTS requests")
        db.execute("DROP TABLE IF EXISTS meta")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
