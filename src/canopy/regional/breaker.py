"""A circuit breaker per arm of a routing service: an upstream (or deployment) that keeps
failing is set aside for a cool-down, so the router's ranking is tried around it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

__all__ = ["Breaker"]


@dataclass
class Breaker:
    """Per upstream: after ``failures`` failures in a row it is ejected for ``cooldown_s``,
    then given one trial call (half-open): a success closes it, a failure ejects it again.
    Safe to share between threads."""

    failures: int = 3
    cooldown_s: float = 30.0
    _streak: dict[str, int] = field(default_factory=dict)
    _open_until: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def order(self, models: list[str]) -> list[str]:
        """``models`` with the ejected ones moved to the end (tried only when the rest
        failed and time remains)."""
        if not self._open_until:  # none ejected (the usual case): no clock, no lock
            return list(models)
        now = time.monotonic()
        with self._lock:
            closed = [m for m in models if self._open_until.get(m, 0.0) <= now]
        return closed + [m for m in models if m not in closed]

    def success(self, model: str) -> None:
        if not self._streak.get(model) and model not in self._open_until:
            return  # nothing to reset (the usual case): no lock
        with self._lock:
            self._streak[model] = 0
            self._open_until.pop(model, None)

    def failure(self, model: str) -> None:
        with self._lock:
            streak = self._streak.get(model, 0) + 1
            self._streak[model] = streak
            if streak >= self.failures:
                self._open_until[model] = time.monotonic() + self.cooldown_s

    def ejected(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return sorted(m for m, until in self._open_until.items() if until > now)
