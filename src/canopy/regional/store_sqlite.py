"""The routing service's store in one SQLite file (:mod:`canopy.regional.store`): the
single-machine default, shared by every worker process on the machine.

WAL mode, so reads never wait for a writer; one connection per thread, each waiting at most
``wait_s`` for another writer's lock (then :class:`~canopy.regional.store.StoreBusy`). A
rating is one ``BEGIN IMMEDIATE`` transaction; a commit survives the process being killed.
The file is watched: deleted or replaced under a running process, it is opened (re-created)
anew, and its generation marker (a row of ``canopy_meta``) tells the process it is not the
store it knew (:class:`~canopy.regional.store.StoreReset`). A file written by the proxy's
earlier layout (tables ``meta``, ``stats``, ``requests``) is
converted once, when first opened.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from canopy.regional.store import (
    RATED_KEPT,
    Call,
    Cell,
    Changes,
    Increment,
    StoreBusy,
    StoreReset,
    StoreUnreachable,
    new_marker,
    seeded,
)

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
CREATE TABLE IF NOT EXISTS canopy_marked (
    ns TEXT NOT NULL, version INTEGER NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (ns, version, id)) WITHOUT ROWID;
"""
class _Refused(Exception):
    """A call of a rating is already rated or gone: the transaction is rolled back."""


_CALL = "id, region, model, cost, created, episode, quality"
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (named in sqlite3 from Python 3.11 on)


class SqliteStore:
    """One SQLite file; safe across threads and processes. ``rated_kept``: how many
    versions back the ids marked rated are kept (table ``canopy_marked``)."""

    rated_kept = RATED_KEPT

    def __init__(self, path: str | Path, *, namespace: str = "", wait_s: float = 1.0) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.namespace = namespace
        self.wait_s = float(wait_s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: dict[threading.Thread, sqlite3.Connection] = {}  # by the thread using it
        self._all_lock = threading.Lock()
        self.generation: str | None = None
        self._file = self._create(30.0)
        with self._busy():
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            try:
                _migrate(db, namespace)
            finally:
                db.close()

    # -- connections ---------------------------------------------------------------------
    def _create(self, timeout: float) -> tuple[int, int]:
        """Open (create) the file with its tables; its identity (device, inode)."""
        with self._busy():
            db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                stat = os.stat(self.path)
            finally:
                db.close()
        return stat.st_dev, stat.st_ino

    def _identity(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        return stat.st_dev, stat.st_ino

    def _db(self) -> sqlite3.Connection:
        """This thread's connection, to the file now at the path (a file deleted or replaced
        under the process is re-created or reopened, not written to unseen)."""
        now = self._identity()
        if now != self._file:
            with self._all_lock:
                if self._identity() != self._file:
                    self._file = self._create(self.wait_s)
        db = getattr(self._local, "db", None)
        if db is not None and self._local.file != self._file:
            with self._all_lock:
                self._all.pop(threading.current_thread(), None)
            db.close()
            db = None
        if db is None:
            db = sqlite3.connect(self.path, timeout=self.wait_s, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a killed process
            self._local.db, self._local.file = db, self._file
            with self._all_lock:
                # a server's worker threads come and go: close the connections of those gone
                # (each holds its own page cache; kept, they grew without bound)
                for gone in [t for t in self._all if not t.is_alive()]:
                    with contextlib.suppress(sqlite3.Error):
                        self._all.pop(gone).close()
                self._all[threading.current_thread()] = db
        return db

    def _marker(self, db: sqlite3.Connection) -> str | None:
        row = db.execute("SELECT value FROM canopy_meta WHERE ns = ? AND key = 'generation'",
                         (self.namespace,)).fetchone()
        return None if row is None else str(row[0])

    def _check(self, db: sqlite3.Connection) -> None:
        marker = self._marker(db)
        if marker != self.generation:
            raise StoreReset(f"SQLite store {self.path}: generation {marker}, not "
                             f"{self.generation} (deleted or replaced)")

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as error:
            code = getattr(error, "sqlite_errorcode", None)  # Python 3.11 on
            locked = code is None or code & 0xFF in _BUSY_CODES
            kind = StoreBusy if locked else StoreUnreachable
            raise kind(f"SQLite store {self.path}: {error}") from error

    @contextlib.contextmanager
    def _write(self, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        db = self._db() if db is None else db
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
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)  # at start: wait
        try:
            with self._write(db):
                row = db.execute("SELECT value FROM canopy_meta WHERE ns = ? AND key = 'lam'",
                                 (self.namespace,)).fetchone()
                if row is not None and float(row[0]) != float(lam):
                    raise ValueError(f"{self.path} holds statistics for lam={float(row[0])}, "
                                     f"not {lam}")
                db.executemany("INSERT OR REPLACE INTO canopy_meta VALUES (?, ?, ?)",
                               [(self.namespace, "lam", repr(float(lam))),
                                (self.namespace, "models", "\n".join(models))])
                db.execute("INSERT OR IGNORE INTO canopy_meta VALUES (?, 'generation', ?)",
                           (self.namespace, new_marker(False)))
                self.generation = self._marker(db)
        finally:
            db.close()

    def reseed(self, cells: Sequence[Cell], cost_max: float) -> bool:
        ns = self.namespace
        with self._write() as db:
            marker = self._marker(db)
            first = not seeded(marker)
            if first:
                marker = new_marker(True)
                db.execute("INSERT OR REPLACE INTO canopy_meta VALUES (?, 'generation', ?)",
                           (ns, marker))
                version = _next_version(db, ns)
                db.executemany(_ADD_CELL, [(ns, c.region, c.model, c.n, c.s, c.q, version)
                                           for c in cells])
                _raise_cost_max(db, ns, cost_max)
            self.generation = marker
        return first

    def ping(self) -> None:
        with self._write():
            pass

    def add_calls(self, calls: Sequence[Call], ttl_s: float) -> None:
        with self._write() as db:
            db.executemany("INSERT OR IGNORE INTO canopy_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(self.namespace, c.id, c.region, c.model, c.cost, c.created,
                             c.episode, c.quality) for c in calls])

    def calls(self, ids: Sequence[str]) -> list[Call | None]:
        db = self._db()
        out: list[Call | None] = []
        with self._busy():
            self._check(db)
            for one in ids:
                row = db.execute(f"SELECT {_CALL} FROM canopy_calls WHERE ns = ? AND id = ?",
                                 (self.namespace, one)).fetchone()
                out.append(None if row is None else Call(*row))
        return out

    def episode(self, episode: str) -> list[Call]:
        db = self._db()
        with self._busy():
            self._check(db)
            rows = db.execute(f"SELECT {_CALL} FROM canopy_calls WHERE ns = ? AND "
                              "episode = ? ORDER BY created",
                              (self.namespace, episode)).fetchall()
        return [Call(*row) for row in rows]

    def rate(self, ids: Sequence[str], quality: float, increments: Sequence[Increment],
             cost_max: float) -> bool:
        ns = self.namespace
        try:
            with self._write() as db:
                self._check(db)
                marked = sum(db.execute("UPDATE canopy_calls SET quality = ? WHERE ns = ? AND "
                                        "id = ? AND quality IS NULL",
                                        (quality, ns, one)).rowcount for one in ids)
                if marked != len(ids):
                    raise _Refused
                version = _next_version(db, ns)
                db.executemany("INSERT INTO canopy_marked VALUES (?, ?, ?)",
                               [(ns, version, one) for one in ids])
                db.execute("DELETE FROM canopy_marked WHERE ns = ? AND version <= ?",
                           (ns, version - self.rated_kept))
                db.executemany(_ADD_CELL, [(ns, i.region, i.model, i.weight,
                                            i.weight * i.reward,
                                            i.weight * i.reward * i.reward, version)
                                           for i in increments])
                _raise_cost_max(db, ns, cost_max)
        except _Refused:
            return False
        return True

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, reading one snapshot of the store this process knows
        (``StoreReset`` if it is another)."""
        db = self._db()
        with self._busy():
            db.execute("BEGIN")
            try:
                self._check(db)
                yield db
            finally:
                db.execute("COMMIT")

    def changes(self, since: int) -> Changes:
        with self._snapshot() as db:  # the version and the cells agree
            meta = dict(db.execute("SELECT key, value FROM canopy_meta WHERE ns = ? AND "
                                   "key IN ('version', 'cost_max')",
                                   (self.namespace,)).fetchall())
            rows = db.execute("SELECT region, model, n, s, q FROM canopy_cells WHERE "
                              "ns = ? AND version > ?", (self.namespace, since)).fetchall()
        return Changes(int(meta.get("version", 0)), tuple(Cell(*row) for row in rows),
                       float(meta.get("cost_max", 0.0)))

    def rated_since(self, version: int) -> list[str] | None:
        with self._snapshot() as db:  # the version and the ids agree
            now = db.execute("SELECT value FROM canopy_meta WHERE ns = ? AND key = 'version'",
                             (self.namespace,)).fetchone()
            ids = [row[0] for row in db.execute(
                "SELECT id FROM canopy_marked WHERE ns = ? AND version > ?",
                (self.namespace, version))]
        return None if version < int(now[0] if now else 0) - self.rated_kept else ids

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

    def namespaces(self, prefix: str) -> dict[str, list[str]]:
        with self._busy():
            rows = self._db().execute("SELECT ns, value FROM canopy_meta WHERE key = 'models'"
                                      " AND substr(ns, 1, ?) = ?",
                                      (len(prefix), prefix)).fetchall()
        return {ns: value.split("\n") for ns, value in rows}

    def close(self) -> None:
        with self._all_lock:
            for db in self._all.values():
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            self._all.clear()
        self._local = threading.local()


_ADD_CELL = ("INSERT INTO canopy_cells VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
             "(ns, region, model) DO UPDATE SET n = n + excluded.n, s = s + excluded.s, "
             "q = q + excluded.q, version = excluded.version")


def _next_version(db: sqlite3.Connection, ns: str) -> int:
    return int(db.execute(
        "INSERT INTO canopy_meta VALUES (?, 'version', '1') ON CONFLICT (ns, key) "
        "DO UPDATE SET value = CAST(value AS INTEGER) + 1 RETURNING value", (ns,)
    ).fetchone()[0])


def _raise_cost_max(db: sqlite3.Connection, ns: str, cost_max: float) -> None:
    db.execute("INSERT INTO canopy_meta VALUES (?, 'cost_max', ?) ON CONFLICT (ns, key) DO "
               "UPDATE SET value = max(CAST(value AS REAL), excluded.value)", (ns, cost_max))


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
