"""The experiment runner: a study's grid of cells times seeds, fanned out over local worker
processes (default) or a Ray cluster, with every finished cell on disk at once.

Resume store: one JSON file per finished (cell, seed), named by the SHA-256 of the study name,
the cell's configuration and the seed, written atomically (temporary file, ``fsync``,
``os.replace``) by the driver as soon as the cell's result arrives. A run that is killed at
any point (Ctrl-C, SIGKILL, a lost Ray worker) leaves only whole files; the next run with the
same store loads them and computes only the missing cells, so no cell is lost and none is
counted twice (the key is unique per cell and seed, and the summary reads one file per key).
Each file carries the SHA-256 of its own content (``checksum``); a file whose content no longer
matches it (edited, truncated, corrupted, or written without one) is computed again and listed
in ``StudyRun.rejected``. The checksum catches accidental change, not a forger who
recomputes it. One store directory serves one run at a time.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import importlib
import json
import math
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from canopy.errors import MissingExtra
from canopy.experiments.study import Measurement, Row, Study, kind_bounds
from canopy.experiments.summary import summarize
from canopy.validation import check_count

__all__ = ["CellStore", "StudyRun", "Task", "cell_key", "execute", "load_study", "plan",
           "run_study"]

Backend = Literal["local", "ray"]
Progress = Callable[[int, int], None]
_UNGUARDED = 3  # exit status of a worker that met run_study while importing the main module


def load_study(reference: str) -> Study:
    """A registered study by name (``canopy list``), or a user's own as ``package.module:NAME``
    (a module importable from ``sys.path`` with a :class:`Study` named ``NAME``); worker
    processes import it by the same reference."""
    if ":" not in reference:
        from canopy.experiments.studies import get_study

        return get_study(reference)
    module, _, name = reference.partition(":")
    if not module or not name.isidentifier():
        raise ValueError(f"study reference {reference!r}: expected package.module:NAME")
    try:
        namespace = importlib.import_module(module)
    except ImportError as error:
        raise ValueError(f"study reference {reference!r}: cannot import {module!r} ({error})"
                         ) from None
    study = getattr(namespace, name, None)
    if not isinstance(study, Study):
        raise TypeError(f"study reference {reference!r}: {module}.{name} is "
                        f"{type(study).__name__}, not a Study")
    return dataclasses.replace(study, module=reference)


def cell_key(study: str, cell: Mapping[str, Any], seed: int) -> str:
    """Stable key of one (cell, seed): SHA-256 of its canonical JSON, 24 hex digits."""
    text = json.dumps({"study": study, "cell": cell, "seed": seed}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Task:
    """One unit of work: the study's module (workers import ``STUDY`` from it, or ``NAME``
    from ``module:NAME``), a cell, a seed."""

    module: str
    study: str
    cell: dict[str, Any]
    seed: int

    @property
    def key(self) -> str:
        return cell_key(self.study, self.cell, self.seed)


def execute(module: str, cell: dict[str, Any], seed: int) -> list[tuple]:
    """Run one cell for one seed in whatever process this is (a pool or Ray worker, or the
    driver); returns plain tuples so the result pickles cheaply."""
    path, _, name = module.partition(":")
    study: Study = getattr(importlib.import_module(path), name or "STUDY")
    out = []
    for m in study.run_cell(cell, seed):
        m = Measurement(*m)
        if not (isinstance(m.value, (int, float)) and math.isfinite(m.value)):
            raise ValueError(f"study {study.name!r} cell {cell} seed {seed} measured "
                             f"{m.metric}={m.value!r} for {m.method}: not a finite number")
        bounds = kind_bounds(m.kind)
        if bounds is not None and not bounds[0] <= m.value <= bounds[1]:
            raise ValueError(f"study {study.name!r} cell {cell} seed {seed} measured "
                             f"{m.metric}={m.value!r} for {m.method}, outside its declared "
                             f"range [{bounds[0]:g}, {bounds[1]:g}]")
        out.append((m.method, m.x_name, None if m.x is None else float(m.x), m.metric,
                    float(m.value), m.kind, m.objective))
    return out


class CellStore:
    """One JSON file per finished (cell, seed) under ``directory``, written atomically."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.rejected: list[str] = []  # "file: why" of each stored cell that failed a check

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, task: Task) -> list[Measurement] | None:
        """The stored measurements of ``task``, or ``None`` if absent; a file that is
        unreadable, of the wrong shape or whose checksum does not match its content gives
        ``None`` too (the cell is computed again and the file replaced) and is recorded in
        ``rejected``."""
        path = self.path(task.key)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._reject(path, "not valid JSON")
            return None
        if not isinstance(record, dict) or (
                record.get("study"), record.get("cell"), record.get("seed")) != (
                task.study, task.cell, task.seed):
            # ``null``, a list, or another cell's record: compute it again
            self._reject(path, "not the record of this cell")
            return None
        if record.get("checksum") != _checksum(record):
            self._reject(path, "its content does not match its checksum")
            return None
        try:
            return [Measurement(*m) for m in record["measurements"]]
        except (KeyError, TypeError):
            self._reject(path, "measurements of the wrong shape")
            return None

    def _reject(self, path: Path, why: str) -> None:
        self.rejected.append(f"{path.name}: {why}")

    def save(self, task: Task, measurements: Sequence[tuple], seconds: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {"study": task.study, "cell": task.cell, "seed": task.seed,
                  "seconds": round(seconds, 4), "measurements": [list(m) for m in measurements]}
        record["checksum"] = _checksum(record)
        fd, tmp = tempfile.mkstemp(prefix=f".{task.key}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle, allow_nan=False)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path(task.key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold ``.lock`` (the holder's pid) for a run: a second run on the same store is
        refused, since it would compute the same cells again; a lock whose process is gone is
        stale and taken over."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / ".lock"
        while True:
            try:
                handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                break
            except FileExistsError:
                holder = _lock_holder(path)
                if holder is not None and holder != os.getpid() and _alive(holder):
                    raise ValueError(f"{self.directory} is in use by another run (process "
                                     f"{holder}); wait for it, or use another output "
                                     "directory") from None
                path.unlink(missing_ok=True)  # stale: its process is gone
        os.write(handle, str(os.getpid()).encode())
        os.close(handle)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def clean_temporary(self) -> None:
        """Remove temporary files left by a run that was killed while writing."""
        for stale in self.directory.glob(".*.tmp"):
            stale.unlink(missing_ok=True)


@dataclass
class StudyRun:
    """Outcome of :func:`run_study`: the parameters used, every measurement (in task order),
    their summary rows, how many tasks were computed now versus loaded from the store, and
    the stored cells that failed a check and were computed again (``"file: why"``)."""

    study: str
    params: dict[str, Any]
    seeds: int
    backend: str
    measurements: list[Measurement]
    rows: list[Row]
    n_tasks: int
    computed: int
    reused: int
    seconds: float
    rejected: list[str] = field(default_factory=list)

    def config(self) -> dict[str, Any]:
        """The ``config`` block of ``results.json``."""
        return {"params": self.params, "seeds": self.seeds, "backend": self.backend,
                "cells": self.n_tasks // self.seeds}


def plan(study: Study, *, quick: bool = False, seeds: int | None = None,
         overrides: Mapping[str, str] | None = None) -> tuple[Any, int, list[Task]]:
    """Validate a configuration and list its tasks, before any work starts: the parameters
    (``--quick`` ones or the full ones, with ``--set`` overrides), the seed count (the paper's
    or ``--quick``'s unless given), and the tasks, seed-major so a partial run covers every
    method."""
    params = study.quick_params if quick else study.params
    if overrides:
        params = study.with_overrides(params, overrides)
    n_seeds = check_count((study.quick_seeds if quick else study.seeds)
                                 if seeds is None else seeds, "seeds")
    cells = study.cells(params)
    if not cells:
        raise ValueError(f"study {study.name!r} has no cells for {params}")
    for cell in cells:
        json.dumps(cell, allow_nan=False)  # a cell must be plain JSON to be hashed and stored
    tasks = [Task(study.module, study.name, dict(cell), seed)
             for seed in range(n_seeds) for cell in cells]
    return params, n_seeds, tasks


def run_study(study: Study | str, *, store: str | os.PathLike, quick: bool = False,
              seeds: int | None = None, overrides: Mapping[str, str] | None = None,
              backend: Backend = "local", workers: int | None = None,
              address: str | None = None, progress: Progress | None = None) -> StudyRun:
    """Run (or resume) ``study`` (a :class:`Study`, or a reference for :func:`load_study`)
    with its cells stored under ``store``.

    ``backend="local"`` uses ``workers`` spawned processes (default: all cores; 1 runs in this
    process); ``backend="ray"`` submits one Ray task per cell to the cluster at ``address``, or
    to a local Ray started with ``workers`` CPUs and shut down afterwards.
    ``progress(done, total)`` is called as cells finish. Every configuration error is raised
    before any cell runs. Worker processes import the main module, so a script that calls
    this must do so under ``if __name__ == "__main__":`` (else a clear ``RuntimeError``).
    """
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise SystemExit(_UNGUARDED)  # a spawned worker importing an unguarded main module
    if isinstance(study, str):
        study = load_study(study)
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    if workers is not None:
        check_count(workers, "workers")
    if address is not None and backend != "ray":
        raise ValueError("address is only used with backend='ray'")
    params, n_seeds, tasks = plan(study, quick=quick, seeds=seeds, overrides=overrides)
    cells = CellStore(store)
    with cells.lock():
        return _run(study, cells, params, n_seeds, tasks, backend=backend, workers=workers,
                    address=address, progress=progress)


def _run(study: Study, cells: CellStore, params: Any, n_seeds: int, tasks: list[Task], *,
         backend: Backend, workers: int | None, address: str | None,
         progress: Progress | None) -> StudyRun:
    started = time.perf_counter()
    if cells.directory.exists():
        cells.clean_temporary()
    results: dict[str, list[Measurement]] = {}
    todo = []
    for task in tasks:
        stored = cells.load(task)
        if stored is None:
            todo.append(task)
        else:
            results[task.key] = stored
    reused = len(results)
    if progress is not None:
        progress(reused, len(tasks))

    def finished(task: Task, measured: list[tuple], seconds: float) -> None:
        cells.save(task, measured, seconds)
        results[task.key] = [Measurement(*m) for m in measured]
        if progress is not None:
            progress(len(results), len(tasks))

    if todo:
        if backend == "ray":
            _run_ray(todo, finished, workers=workers, address=address)
        else:
            _run_local(todo, finished, workers=workers or os.cpu_count() or 1)
    measurements = [m for task in tasks for m in results[task.key]]
    return StudyRun(study=study.name, params=json.loads(json.dumps(asdict(params))),
                    seeds=n_seeds, backend=backend,
                    measurements=measurements, rows=summarize(measurements),
                    n_tasks=len(tasks), computed=len(todo), reused=reused,
                    seconds=time.perf_counter() - started, rejected=list(cells.rejected))


def _timed(module: str, cell: dict[str, Any], seed: int) -> tuple[list[tuple], float]:
    started = time.perf_counter()
    return execute(module, cell, seed), time.perf_counter() - started


def _run_local(todo: list[Task], finished: Callable[[Task, list[tuple], float], None], *,
               workers: int) -> None:
    if workers == 1 or len(todo) == 1:
        for task in todo:
            finished(task, *_timed(task.module, task.cell, task.seed))
        return
    context = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=context,
                                  initializer=_die_with_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(_timed, t.module, t.cell, t.seed): t for t in todo}
        for future in cf.as_completed(futures):
            try:
                result = future.result()
            except cf.process.BrokenProcessPool:
                _check_main_guarded(context)
                raise
            finished(futures[future], *result)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _nothing() -> None:
    """A spawned process's whole work when probing the main module."""


def _check_main_guarded(context: Any) -> None:
    """After the pool broke: start one process the way the pool does; if importing the main
    module ran :func:`run_study` there, say so (the cause the pool cannot report)."""
    probe = context.Process(target=_nothing)
    probe.start()
    probe.join(120)
    if probe.exitcode == _UNGUARDED:
        main = getattr(sys.modules.get("__main__"), "__file__", "the main module")
        raise RuntimeError(f"{main} calls run_study when it is imported, and every worker "
                           "process imports it: put the call under "
                           "`if __name__ == \"__main__\":`") from None


def _checksum(record: dict[str, Any]) -> str:
    """SHA-256 of a cell record's canonical JSON, its ``checksum`` field left out."""
    content = {key: value for key, value in record.items() if key != "checksum"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _lock_holder(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent(parent: int) -> None:
    """Pool-worker initializer: exit when the driver is gone (a SIGKILLed driver cannot shut
    its pool down, and the workers would otherwise run on, orphaned)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="canopy-parent-watch", daemon=True).start()


def _run_ray(todo: list[Task], finished: Callable[[Task, list[tuple], float], None], *,
             workers: int | None, address: str | None) -> None:
    try:
        import ray
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise MissingExtra("backend='ray' needs Ray: pip install 'canopy-bandits[ray]'") from error
    owned = not ray.is_initialized()
    if owned:
        # Workers of a local cluster import canopy and the study modules from this sys.path.
        paths = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
        ray.init(address=address, num_cpus=workers if address is None else None,
                 include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONPATH": paths}})
    try:
        remote = ray.remote(num_cpus=1, max_retries=3)(_timed)
        pending = {remote.remote(t.module, t.cell, t.seed): t for t in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            task = pending.pop(ready[0])
            finished(task, *ray.get(ready[0]))
    finally:
        if owned:
            ray.shutdown()
