"""The processes of engines started on loopback: the tree under a server (an engine forks
workers that outlive a plain ``terminate``) and a command's ending by ``SIGTERM`` as by
Ctrl-C, so that every engine it started is stopped on the way out."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["alive", "descendants", "ended_by_signals", "wait_until_answering"]


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found first)."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@contextmanager
def ended_by_signals() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does (an exception, so every engine it started is
    stopped on the way out: ``timeout`` and ``kill`` leave no engine behind)."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_until_answering(process: subprocess.Popen, url: str, *, name: str, timeout: float,
                         error: type[Exception], output_tail: Callable[[], str],
                         headers: Mapping[str, str] | None = None,
                         interval: float = 0.3) -> None:
    """Poll ``GET url`` until it answers 200. ``process`` exiting first, or no answer within
    ``timeout`` seconds: ``error``, naming ``name`` and quoting ``output_tail()``."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise error(f"{name} exited with code {process.returncode} before answering; "
                        f"its output ends:\n{output_tail()}")
        try:
            if httpx.get(url, timeout=2.0, headers=dict(headers or {})).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise error(f"{name} did not answer within {timeout:g} s; its output ends:\n"
                        f"{output_tail()}")
        time.sleep(interval)
