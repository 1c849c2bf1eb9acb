"""Compact key index: int64 block keys -> int32 node ids in one open-addressing table.

A Python dict of ``(parent, key)`` tuples costs some 150 bytes an entry; this table costs
12 bytes a slot (an int64 key, an int32 value) at a load factor of at most one half, so at
most 24 bytes per key, plus the slack of doubling. Linear probing with backward-shift
deletion (no tombstones: a table that sees as many deletions as insertions, as an index fed
by eviction events does, never degrades). Keys are any int64 but ``EMPTY`` (engines' block
hashes are folded to 63 bits by :func:`fold`); the hot paths are numba kernels that a caller
can use inside its own compiled loops (:func:`find`, :func:`put`, :func:`delete`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from canopy.validation import check_count

__all__ = ["EMPTY", "HashIndex", "delete", "find", "fold", "put"]

EMPTY = np.int64(-(2 ** 63))
"""The empty slot's key (never a folded key)."""

_MIX = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(cache=True, inline="always")
def _slot(key, mask):
    h = np.uint64(key) * _MIX
    return np.int64((h >> np.uint64(32)) ^ (h & np.uint64(0xFFFFFFFF))) & mask


@nb.njit(cache=True)
def find(keys: np.ndarray, values: np.ndarray, key: int) -> int:
    """Value of ``key``, or -1 when absent."""
    mask = len(keys) - 1
    i = _slot(key, mask)
    while True:
        k = keys[i]
        if k == key:
            return values[i]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@nb.njit(cache=True)
def put(keys: np.ndarray, values: np.ndarray, key: int, value: int) -> bool:
    """Set ``key -> value``; True when the key is new. The caller keeps the load <= 1/2."""
    mask = len(keys) - 1
    i = _slot(key, mask)
    while True:
        k = keys[i]
        if k == key:
            values[i] = value
            return False
        if k == EMPTY:
            keys[i] = key
            values[i] = value
            return True
        i = (i + 1) & mask


@nb.njit(cache=True)
def delete(keys: np.ndarray, values: np.ndarray, key: int) -> int:
    """Remove ``key``; its value, or -1 when absent. Backward shift keeps every probe chain
    unbroken (Knuth, TAOCP vol. 3, Algorithm 6.4R)."""
    mask = len(keys) - 1
    i = _slot(key, mask)
    while keys[i] != key:
        if keys[i] == EMPTY:
            return -1
        i = (i + 1) & mask
    out = values[i]
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == EMPTY:
            break
        home = _slot(keys[j], mask)
        # move j's entry into the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            keys[i] = keys[j]
            values[i] = values[j]
            i = j
    keys[i] = EMPTY
    values[i] = -1
    return out


@nb.njit(cache=True)
def _rehash(keys: np.ndarray, values: np.ndarray, new_keys: np.ndarray,
            new_values: np.ndarray) -> None:
    for i in range(len(keys)):
        if keys[i] != EMPTY:
            put(new_keys, new_values, keys[i], values[i])


def fold(key: int | bytes) -> int:
    """An engine's block hash as an int64 key: an int taken modulo 2**63, bytes (a sha256
    digest) by their first eight bytes; never :data:`EMPTY`."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        key = int.from_bytes(bytes(key[:8]), "big")
    return int(key) % (2 ** 63)


class HashIndex:
    """A growable int64 -> int32 map (node ids of a block table)."""

    def __init__(self, capacity: int = 1024) -> None:
        check_count(capacity, "capacity")
        slots = 1 << max(4, (2 * capacity - 1).bit_length())
        self.keys = np.full(slots, EMPTY, dtype=np.int64)
        self.values = np.full(slots, -1, dtype=np.int32)
        self.size = 0

    def get(self, key: int) -> int:
        """Node of ``key``, -1 when absent."""
        return int(find(self.keys, self.values, key))

    def set(self, key: int, value: int) -> None:
        if 2 * (self.size + 1) > len(self.keys):
            self.grow()
        if put(self.keys, self.values, key, value):
            self.size += 1

    def pop(self, key: int) -> int:
        """Remove ``key``; its node, or -1 when absent."""
        value = int(delete(self.keys, self.values, key))
        if value >= 0:
            self.size -= 1
        return value

    def grow(self) -> None:
        """Double the table (rehashing every key)."""
        keys = np.full(2 * len(self.keys), EMPTY, dtype=np.int64)
        values = np.full(2 * len(self.keys), -1, dtype=np.int32)
        _rehash(self.keys, self.values, keys, values)
        self.keys, self.values = keys, values

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def __len__(self) -> int:
        return self.size
