"""Load per replica, as a gateway sees it: one float64 table, a row per quantity and a column
per replica, so compiled policies and the simulator read and update it in place.

Rows: ``INFLIGHT`` requests sent and not finished; ``QUEUED`` requests waiting for their first
token; ``QUEUED_TOKENS`` the prompt tokens those still have to prefill (as the index predicted
when they were sent); ``ACTIVE_BLOCKS`` the KV blocks of the in-flight requests (Dynamo's
decode blocks); ``KV_USE`` the fraction of the replica's KV cache in use by running
requests (the engines' ``gpu_cache_usage``; cached but free blocks count as free);
``TTFT`` an exponential moving average of the observed time to first token (s).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from canopy.validation import check_count, check_number

__all__ = ["ACTIVE_BLOCKS", "FIELDS", "INFLIGHT", "KV_USE", "QUEUED", "QUEUED_TOKENS", "TTFT",
           "TTFT_DECAY", "Load", "finished", "first_token", "routed"]

INFLIGHT, QUEUED, QUEUED_TOKENS, ACTIVE_BLOCKS, KV_USE, TTFT = range(6)
FIELDS = ("inflight", "queued", "queued_tokens", "active_blocks", "kv_use", "ttft_s")
TTFT_DECAY = 0.1
"""Weight of the newest observation in the TTFT moving average."""


@nb.njit(cache=True)
def routed(table: np.ndarray, replica: int, prefill_tokens: float, blocks: float,
           capacity: float) -> None:
    """A request of ``blocks`` KV blocks with ``prefill_tokens`` to compute was sent."""
    table[INFLIGHT, replica] += 1.0
    table[QUEUED, replica] += 1.0
    table[QUEUED_TOKENS, replica] += prefill_tokens
    table[ACTIVE_BLOCKS, replica] += blocks
    table[KV_USE, replica] = min(1.0, table[ACTIVE_BLOCKS, replica] / capacity)


@nb.njit(cache=True)
def first_token(table: np.ndarray, replica: int, prefill_tokens: float, ttft: float) -> None:
    """Its first token arrived after ``ttft`` seconds."""
    table[QUEUED, replica] = max(table[QUEUED, replica] - 1.0, 0.0)
    table[QUEUED_TOKENS, replica] = max(table[QUEUED_TOKENS, replica] - prefill_tokens, 0.0)
    old = table[TTFT, replica]
    table[TTFT, replica] = ttft if old == 0.0 else old + TTFT_DECAY * (ttft - old)


@nb.njit(cache=True)
def finished(table: np.ndarray, replica: int, blocks: float, capacity: float) -> None:
    """It finished (its last token was sent)."""
    table[INFLIGHT, replica] = max(table[INFLIGHT, replica] - 1.0, 0.0)
    table[ACTIVE_BLOCKS, replica] = max(table[ACTIVE_BLOCKS, replica] - blocks, 0.0)
    table[KV_USE, replica] = min(1.0, table[ACTIVE_BLOCKS, replica] / capacity)


class Load:
    """The load table of ``n_replicas`` replicas of ``capacity_blocks`` KV blocks each."""

    def __init__(self, n_replicas: int, *, capacity_blocks: int) -> None:
        self.n_replicas = check_count(n_replicas, "n_replicas")
        self.capacity_blocks = check_count(capacity_blocks, "capacity_blocks")
        self.table = np.zeros((len(FIELDS), n_replicas))

    def _replica(self, replica: int) -> int:
        if not 0 <= replica < self.n_replicas:
            raise ValueError(f"replica must be in 0..{self.n_replicas - 1}, got {replica}")
        return replica

    def routed(self, replica: int, prefill_tokens: float, blocks: float) -> None:
        """A request was sent to ``replica``."""
        routed(self.table, self._replica(replica),
               check_number(prefill_tokens, "prefill_tokens", low=0.0),
               check_number(blocks, "blocks", low=0.0), float(self.capacity_blocks))

    def first_token(self, replica: int, prefill_tokens: float, ttft_s: float) -> None:
        """Its first token came back after ``ttft_s`` seconds."""
        first_token(self.table, self._replica(replica),
                    check_number(prefill_tokens, "prefill_tokens", low=0.0),
                    check_number(ttft_s, "ttft_s", low=0.0))

    def finished(self, replica: int, blocks: float) -> None:
        """It finished."""
        finished(self.table, self._replica(replica), check_number(blocks, "blocks", low=0.0),
                 float(self.capacity_blocks))

    def set_kv_use(self, replica: int, use: float) -> None:
        """The engine's own KV-use figure (its metrics endpoint) replaces the estimate."""
        self.table[KV_USE, self._replica(replica)] = check_number(use, "use", low=0.0, high=1.0)

    def as_dict(self) -> dict[str, list[float]]:
        return {name: self.table[row].tolist() for row, name in enumerate(FIELDS)}
