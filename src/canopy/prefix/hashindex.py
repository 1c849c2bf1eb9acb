"""A prefix tree's topology by key: the compact key index every keyed host of the tree shares.

Blocks arrive keyed by what their host hashes: vLLM's block hashes (sha256 digests), SGLang's
page keys, Mooncake's ``hash_ids``, token tuples. :func:`fold` turns a key into a
non-negative int64 (an int modulo 2^63; a digest by its first eight bytes, zero-padded;
anything else by its Python hash), :func:`fold_all` a whole chain at once (one pass of numpy
for a chain of ints or of equal-length digests). :class:`KeyTree` holds, per node, its
folded key and its parent, and one open-addressing table of node ids (``int32``, a load of
at most one half: 8 to 16 bytes a node) that finds a node by its key, or by its key under
its parent when keys name a block within its parent (``by_parent``). A node's key is kept
in its column only, so a slot is four bytes; linear probing with backward-shift deletion
(no tombstones: an index fed as many deletions as insertions, as one fed by eviction events
is, never degrades).

Hosts: :class:`~canopy.prefix.blocks.BlockTree` (the prefix cache's state: nodes appended in
order of first appearance, renumbered when it forgets, :meth:`KeyTree.compact`) and the
fleet's replica index (nodes freed one by one as no replica holds them, their ids reused,
:meth:`KeyTree.free`). A request's whole chain is looked up or inserted in one compiled call
(:func:`find_chain`, :func:`insert_chain`); the kernels take the arrays, so a host's own
compiled loop can call them too. Two keys that fold alike are one block: for 10^7 blocks of
digests, the odds of any such pair are about 10^-5.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import cast

import numba as nb
import numpy as np

from canopy.validation import check_count

__all__ = ["KeyTree", "as_keys", "find", "find_chain", "fold", "fold_all", "fold_digests",
           "free_node", "free_nodes", "insert_chain"]

_MASK63 = (1 << 63) - 1
_FOLD = np.int64(_MASK63)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_MIX_PARENT = np.uint64(0xC2B2AE3D27D4EB4F)
N, SIZE, FREE = 0, 1, 2
"""The state vector's fields: nodes ever handed out (the high-water mark), live nodes, the
first free node (-1: none; a free node's key column holds ``-2 - next free``)."""


def fold(key: Hashable) -> int:
    """A block key as a non-negative int64: an int modulo 2^63, bytes (a digest) by their
    first eight bytes (big-endian, zero-padded), any other hashable by its Python hash
    modulo 2^63."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(key[:8]).ljust(8, b"\0"), "big") & _MASK63
    if isinstance(key, (int, np.integer)):
        return int(key) & _MASK63
    return hash(key) & _MASK63


def as_keys(keys: Iterable[Hashable] | np.ndarray) -> np.ndarray:
    """Keys as the kernels take them: an int64 array as it is (they fold it as they read
    it), anything else :func:`fold_all`."""
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64:
        return keys
    return fold_all(keys)


def fold_all(keys: Iterable[Hashable]) -> np.ndarray:
    """:func:`fold` of each key, as an int64 array: one numpy pass for an integer array, a
    list of ints, or a list of equal-length digests (vLLM's block hashes)."""
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        return (keys if keys.dtype == np.int64 else keys.astype(np.int64)) & _MASK63
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    if not keys:
        return np.zeros(0, dtype=np.int64)
    first = keys[0]
    if type(first) is bytes and len(first) >= 8:
        try:
            same = max(map(len, keys)) == len(first) == min(map(len, keys))
        except TypeError:  # not all bytes
            same = False
        if same:
            return fold_digests(cast("list[bytes]", keys))
    elif type(first) is int:
        try:
            ints = np.array(keys)
        except (OverflowError, ValueError, TypeError):
            ints = None
        if ints is not None and ints.ndim == 1 and ints.dtype.kind in "iu":
            return ints.astype(np.int64) & _MASK63
    return np.fromiter(map(fold, keys), dtype=np.int64, count=len(keys))


def fold_digests(digests: list[bytes]) -> np.ndarray:
    """:func:`fold` of digests of one hash function (all of one width: an engine's block
    hashes), one numpy pass over their concatenation when they are at least eight bytes
    wide (their total length is all that is checked), else one key at a time."""
    joined = b"".join(digests)
    width = len(digests[0]) if digests else 8
    if width < 8 or len(joined) != width * len(digests):
        return np.fromiter(map(fold, digests), dtype=np.int64, count=len(digests))
    heads = np.ndarray((len(digests),), dtype=">u8", buffer=joined, strides=(width,))
    return heads.astype(np.int64) & _MASK63


# ---------------------------------------------------------------- kernels
@nb.njit(cache=True, inline="always")
def _home(k, p, by_parent, mask):
    h = np.uint64(k)
    if by_parent:
        h ^= np.uint64(p + 1) * _MIX_PARENT
    h *= _MIX
    return np.int64((h >> np.uint64(32)) ^ (h & np.uint64(0xFFFFFFFF))) & mask


@nb.njit(cache=True)
def find(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, k: int, p: int,
         by_parent: bool) -> int:
    """The node of key ``k`` (an int64, folded here; under node ``p`` when ``by_parent``),
    -1 when absent."""
    k &= _FOLD
    mask = len(slots) - 1
    i = _home(k, p, by_parent, mask)
    while True:
        v = slots[i]
        if v < 0:
            return -1
        if key[v] == k and (not by_parent or parent[v] == p):
            return v
        i = (i + 1) & mask


@nb.njit(cache=True)
def _place(slots, key, parent, v, by_parent):
    """Node ``v``, known absent, into the table."""
    mask = len(slots) - 1
    i = _home(key[v], parent[v], by_parent, mask)
    while slots[i] >= 0:
        i = (i + 1) & mask
    slots[i] = v


@nb.njit(cache=True)
def _unplace(slots, key, parent, v, by_parent):
    """Node ``v`` out of the table; backward shift keeps every probe chain unbroken (Knuth,
    TAOCP vol. 3, Algorithm 6.4R)."""
    mask = len(slots) - 1
    i = _home(key[v], parent[v], by_parent, mask)
    while slots[i] != v:
        if slots[i] < 0:
            return
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        w = slots[j]
        if w < 0:
            break
        home = _home(key[w], parent[w], by_parent, mask)
        # move j's entry into the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            slots[i] = w
            i = j
    slots[i] = -1


@nb.njit(cache=True)
def find_chain(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, keys: np.ndarray,
               by_parent: bool, out: np.ndarray) -> int:
    """The nodes of ``keys`` (int64, folded as they are read) into ``out`` (-1: absent;
    with ``by_parent`` a chain, root first, whose keys after a miss are absent too);
    returns how many lead before the first miss."""
    lead = -1
    p = -1
    for j in range(len(keys)):
        v = find(slots, key, parent, keys[j], p, by_parent)
        out[j] = v
        if v < 0:
            if lead < 0:
                lead = j
            if by_parent:
                out[j:] = -1
                return lead
        p = v
    return len(keys) if lead < 0 else lead


@nb.njit(cache=True)
def insert_chain(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, state: np.ndarray,
                 keys: np.ndarray, root: int, by_parent: bool, out: np.ndarray) -> None:
    """The nodes of the chain of ``keys`` (int64, folded as they are read; root first, the
    first under node ``root``) into ``out``; a key met for the first time becomes a node (a
    free one, else the next id) under the chain's previous node. The caller leaves room
    (:meth:`KeyTree.reserve`)."""
    p = root
    for j in range(len(keys)):
        k = keys[j] & _FOLD
        v = find(slots, key, parent, k, p, by_parent)
        if v < 0:
            v = state[FREE]
            if v >= 0:
                state[FREE] = -2 - key[v]
            else:
                v = state[N]
                state[N] += 1
            key[v] = k
            parent[v] = p
            _place(slots, key, parent, v, by_parent)
            state[SIZE] += 1
        out[j] = v
        p = v


@nb.njit(cache=True)
def free_node(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, state: np.ndarray,
              v: int, by_parent: bool) -> None:
    """Node ``v`` leaves the index; its id is handed out again."""
    _unplace(slots, key, parent, v, by_parent)
    key[v] = -2 - state[FREE]
    parent[v] = -1
    state[FREE] = v
    state[SIZE] -= 1


@nb.njit(cache=True)
def free_nodes(slots: np.ndarray, key: np.ndarray, parent: np.ndarray, state: np.ndarray,
               nodes: np.ndarray, by_parent: bool) -> None:
    """:func:`free_node` of each of ``nodes``."""
    for v in nodes:
        free_node(slots, key, parent, state, v, by_parent)


@nb.njit(cache=True)
def _rebuild(slots, key, parent, n, by_parent):
    slots[:] = -1
    for v in range(n):
        if key[v] >= 0:
            _place(slots, key, parent, v, by_parent)


def _table(nodes: int) -> np.ndarray:
    """An empty table for ``nodes`` keys at a load of at most one half."""
    return np.full(1 << max(4, (2 * max(nodes, 1) - 1).bit_length()), -1, dtype=np.int32)


class KeyTree:
    """Nodes of a prefix tree with their folded keys and parents, found by key.

    Room for ``capacity`` nodes to start; ``by_parent``: a key names a block within its
    parent (token blocks), so a node is found by its key under its parent node, rather than
    by its key alone (a key that names its whole prefix: a chained hash). ``parent``: the
    parent column of a tree whose nodes are known (a trace's), keyed by :meth:`name`."""

    def __init__(self, capacity: int = 1024, *, by_parent: bool = False,
                 parent: np.ndarray | None = None) -> None:
        self.by_parent = bool(by_parent)
        if parent is None:
            check_count(capacity, "capacity")
            self.parent = np.full(capacity, -1, dtype=np.int64)
            self.key = np.full(capacity, -1, dtype=np.int64)
            self.state = np.array([0, 0, -1], dtype=np.int64)
        else:  # a known tree: its keys come when it is named (the key column with them)
            self.parent = parent
            self.key = np.zeros(0, dtype=np.int64)
            self.state = np.array([len(parent), 0, -1], dtype=np.int64)
        self.slots = _table(len(self.key) // 2)

    @property
    def n(self) -> int:
        """Node ids handed out so far (ids below it are nodes or free)."""
        return int(self.state[N])

    @n.setter
    def n(self, value: int) -> None:
        self.state[N] = value

    @property
    def size(self) -> int:
        """Keyed nodes."""
        return int(self.state[SIZE])

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        """Memory of the key, parent and slot columns."""
        return self.key.nbytes + self.parent.nbytes + self.slots.nbytes

    @property
    def spare(self) -> int:
        """Nodes the columns take before they must grow (:meth:`grow`)."""
        return len(self.key) - self.size

    def grow(self, capacity: int) -> None:
        """Columns with room for ``capacity`` nodes (the host grows its own beside them)."""
        more = capacity - len(self.key)
        if more > 0:
            self.parent = np.concatenate([self.parent, np.full(more, -1, dtype=np.int64)])
            self.key = np.concatenate([self.key, np.full(more, -1, dtype=np.int64)])

    def reserve(self, nodes: int) -> None:
        """Room for ``nodes`` more keys: the columns (doubled when short) and the table
        (doubled, every key placed again, when it would pass a load of one half)."""
        if self.spare < nodes:
            self.grow(max(2 * len(self.key), self.size + nodes))
        if 2 * (self.size + nodes) > len(self.slots):
            self.slots = _table(self.size + nodes)
            _rebuild(self.slots, self.key, self.parent, self.n, self.by_parent)

    def get(self, key: Hashable, parent: int = -1) -> int:
        """The node of ``key`` (under node ``parent`` when keyed by parent); -1 when absent."""
        return int(find(self.slots, self.key, self.parent, fold(key), parent, self.by_parent))

    def find(self, keys: Iterable[Hashable] | np.ndarray) -> tuple[np.ndarray, int]:
        """``(nodes, lead)``: the nodes of ``keys`` (-1: absent, and with ``by_parent`` every
        key after a miss) and how many lead before the first miss, one compiled call."""
        folded = as_keys(keys)
        out = np.empty(len(folded), dtype=np.int64)
        lead = find_chain(self.slots, self.key, self.parent, folded, self.by_parent, out)
        return out, int(lead)

    def chain(self, keys: Iterable[Hashable] | np.ndarray, root: int = -1) -> np.ndarray:
        """The nodes of a chain of ``keys``, root first under node ``root``; keys met for
        the first time become nodes (the columns grow when short), one compiled call."""
        folded = as_keys(keys)
        self.reserve(len(folded))
        out = np.empty(len(folded), dtype=np.int64)
        insert_chain(self.slots, self.key, self.parent, self.state, folded, root,
                     self.by_parent, out)
        return out

    def free(self, nodes: np.ndarray) -> None:
        """``nodes`` leave the index (their ids are handed out again)."""
        free_nodes(self.slots, self.key, self.parent, self.state,
                   np.asarray(nodes, dtype=np.int64), self.by_parent)

    def name(self, keys: Iterable[Hashable]) -> None:
        """Key node ``v`` of a known tree by ``keys[v]``."""
        folded = fold_all(keys)
        if len(folded) != self.n:
            raise ValueError(f"{len(folded)} keys for a tree of {self.n} nodes")
        self.key = folded
        self.state[SIZE] = len(folded)
        self.slots = _table(len(folded))
        _rebuild(self.slots, self.key, self.parent, self.n, self.by_parent)

    def compact(self, kept: np.ndarray, remap: np.ndarray) -> None:
        """Keep nodes ``kept`` (ascending, ancestors with their descendants), renumbered
        ``remap[v]`` (-1: dropped), in order: parents stay below their children."""
        m = len(kept)
        parent = self.parent[kept]
        self.parent[:m] = np.where(parent >= 0, remap[np.maximum(parent, 0)], -1)
        self.key[:m] = self.key[kept]
        self.parent[m:self.n] = -1
        self.key[m:self.n] = -1
        self.state[:] = (m, np.count_nonzero(self.key[:m] >= 0), -1)
        _rebuild(self.slots, self.key, self.parent, m, self.by_parent)
