"""The processes of engines started on loopback: the tree under a server (an engine forks
workers that outlive a plain ``terminate``) and a command's ending by ``SIGTERM`` as by
Ctrl-C, so that every engine it started is stopped on the way out."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["alive", "descendants", "ended_by_signals"]


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
