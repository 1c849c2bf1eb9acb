"""The routing service's store in this process's memory (:mod:`canopy.regional.store`):
for tests, one-process services and LiteLLM routers that need not persist."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from canopy.regional.store import (
    RATED_KEPT,
    Call,
    Cell,
    Changes,
    Increment,
    new_marker,
    seeded,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    """Everything in dictionaries behind one lock; nothing survives the process.
    ``rated_kept``: how many versions back the ids marked rated are kept."""

    rated_kept = RATED_KEPT

    def __init__(self, *, namespace: str = "") -> None:
        self.url = "memory"
        self.namespace = namespace
        self._lock = threading.Lock()
        self._meta: dict[str, object] = {}
        self._calls: dict[str, Call] = {}
        self._cells: dict[tuple[str, str], tuple[float, float, float, int]] = {}
        self._version = 0
        self._cost_max = 0.0
        self._rated: deque[tuple[int, str]] = deque()  # (version, id) of each call rated
        self._marker = new_marker(False)
        self.generation: str | None = self._marker

    def check_meta(self, models: Sequence[str], lam: float) -> None:
        with self._lock:
            self.generation = self._marker
            saved = self._meta.setdefault("lam", float(lam))
            if saved != float(lam):
                raise ValueError(f"the store holds statistics for lam={saved}, not {lam}")
            self._meta["models"] = list(models)

    def reseed(self, cells: Sequence[Cell], cost_max: float) -> bool:
        with self._lock:
            first = not seeded(self._marker)
            if first:
                self._marker = new_marker(True)
                self._version += 1
                for c in cells:
                    n, s, q, _ = self._cells.get((c.region, c.model), (0.0, 0.0, 0.0, 0))
                    self._cells[(c.region, c.model)] = (n + c.n, s + c.s, q + c.q,
                                                        self._version)
                self._cost_max = max(self._cost_max, cost_max)
            self.generation = self._marker
            return first

    def ping(self) -> None:
        pass

    def add_calls(self, calls: Sequence[Call], ttl_s: float) -> None:
        with self._lock:
            for call in calls:
                self._calls.setdefault(call.id, call)

    def calls(self, ids: Sequence[str]) -> list[Call | None]:
        with self._lock:
            return [self._calls.get(one) for one in ids]

    def episode(self, episode: str) -> list[Call]:
        with self._lock:
            found = [c for c in self._calls.values() if c.episode == episode]
        return sorted(found, key=lambda c: c.created)

    def rate(self, ids: Sequence[str], quality: float, increments: Sequence[Increment],
             cost_max: float) -> bool:
        with self._lock:
            found = [self._calls.get(one) for one in ids]
            calls = [c for c in found if c is not None and c.quality is None]
            if len(calls) < len(found):
                return False
            self._version += 1
            for call in calls:
                self._calls[call.id] = replace(call, quality=quality)
                self._rated.append((self._version, call.id))
            while self._rated and self._rated[0][0] <= self._version - self.rated_kept:
                self._rated.popleft()
            for inc in increments:
                n, s, q, _ = self._cells.get((inc.region, inc.model), (0.0, 0.0, 0.0, 0))
                self._cells[(inc.region, inc.model)] = (
                    n + inc.weight, s + inc.weight * inc.reward,
                    q + inc.weight * inc.reward * inc.reward, self._version)
            self._cost_max = max(self._cost_max, cost_max)
            return True

    def changes(self, since: int) -> Changes:
        with self._lock:
            cells = tuple(Cell(region, model, n, s, q)
                          for (region, model), (n, s, q, v) in self._cells.items() if v > since)
            return Changes(self._version, cells, self._cost_max)

    def rated_since(self, version: int) -> list[str] | None:
        with self._lock:
            if version < self._version - self.rated_kept:
                return None
            return [one for at, one in self._rated if at > version]

    def expire(self, older_than: float) -> int:
        with self._lock:
            old = [one for one, c in self._calls.items() if c.created < older_than]
            for one in old:
                del self._calls[one]
        return len(old)

    def counts(self) -> dict[str, int]:
        with self._lock:
            rated = sum(c.quality is not None for c in self._calls.values())
            return {"requests": len(self._calls), "with_feedback": rated}

    def namespaces(self, prefix: str) -> dict[str, list[str]]:
        with self._lock:
            models = self._meta.get("models")
        if models is None or not self.namespace.startswith(prefix):
            return {}
        return {self.namespace: list(models)}

    def close(self) -> None:
        pass
