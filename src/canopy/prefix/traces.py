"""Request traces as paths in one prefix tree of KV blocks (paper Section 4, "Serving systems").

A trace is a sequence of requests; each request is the chain of its prompt's KV blocks, root
first. Every distinct chain prefix is one node of a global prefix tree, so a request is a
root-to-node path and a cache is an ancestor-closed set of nodes. Two readers build it:

* :func:`load_mooncake` reads the Mooncake JSONL format (``timestamp``, ``input_length``,
  ``output_length``, ``hash_ids``; one object a line). Block identity is the chain of hashes
  up to it, so a hash reused under a different parent is a different node.
* :func:`load_prompt_log` reads plain prompt logs (one request a line: a JSON list of token
  ids, or an object with ``tokens``/``token_ids`` and optional ``timestamp``) and chains the
  tokens into blocks of ``block_size`` tokens; only full blocks are cacheable, as in vLLM.

:func:`resolve` turns ``conversation``, ``synthetic``, ``toolagent`` or a file path into a
trace, and :func:`shifted` builds the popularity-shift scenario (two workloads with disjoint
block spaces).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from canopy import data, safeio
from canopy.data import bad_line, jsonl_rows
from canopy.validation import check_count, check_nonnegative

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TRACE_FILES",
    "Trace",
    "from_paths",
    "full_blocks",
    "iter_mooncake",
    "load_mooncake",
    "load_prompt_log",
    "resolve",
    "shifted",
]

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per KV block in the Mooncake traces (their ``hash_ids`` hash 512-token blocks)."""

TRACE_FILES = {
    "conversation": "conversation_trace.jsonl",
    "synthetic": "synthetic_trace.jsonl",
    "toolagent": "toolagent_trace.jsonl",
}
"""Named Mooncake FAST'25 traces -> file inside the ``mooncake`` data set."""

MAX_TRACE_BYTES = 64 * safeio.MiB
"""A trace file above this size is refused (``CANOPY_MAX_INPUT_MB`` raises the cap)."""
MAX_REQUEST_BLOCKS = 65_536
"""Blocks in one request (33.5 M tokens at Mooncake's 512 a block)."""
MAX_NODES = 4_000_000
"""Distinct blocks in one trace: the prefix tree lives in memory (about 250 bytes each)."""


@dataclass(frozen=True)
class Trace:
    """Requests as root-to-node paths in one prefix tree of blocks.

    ``parent[v]`` is the parent block of node ``v`` (``-1`` under the virtual root) and
    ``depth[v]`` its 1-based position in every chain through it. Request ``i`` is
    ``nodes[offsets[i]:offsets[i + 1]]``, root first; ``timestamps`` are in milliseconds,
    ``input_tokens`` the prompt length (for the time-to-first-token model).
    """

    name: str
    parent: np.ndarray
    depth: np.ndarray
    offsets: np.ndarray
    nodes: np.ndarray
    timestamps: np.ndarray
    input_tokens: np.ndarray
    block_size: int

    @property
    def n_requests(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    @property
    def n_refs(self) -> int:
        """Block references: the total length of all request paths."""
        return len(self.nodes)

    def path(self, i: int) -> np.ndarray:
        """Blocks of request ``i``, root first."""
        return self.nodes[self.offsets[i]:self.offsets[i + 1]]

    def head(self, n: int) -> Trace:
        """The first ``n`` requests (nodes renumbered to the ones they use)."""
        if not 0 <= n <= self.n_requests:
            raise ValueError(f"n must be in 0..{self.n_requests}, got {n}")
        paths = (self.path(i) for i in range(n))
        return from_paths(paths, name=f"{self.name}[:{n}]", block_size=self.block_size,
                          timestamps=self.timestamps[:n], input_tokens=self.input_tokens[:n])


class _Trie:
    """Builder: chains of keys -> node ids of one prefix tree."""

    def __init__(self, max_nodes: int = MAX_NODES) -> None:
        self.index: dict[tuple[int, object], int] = {}
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.max_nodes = max_nodes

    def chain(self, keys: Iterable[object]) -> array:
        out = array("q")
        node = -1
        for key in keys:
            child = self.index.get((node, key))
            if child is None:
                child = len(self.parent)
                if child >= self.max_nodes:
                    raise ValueError(f"more than {self.max_nodes:,} distinct blocks: too "
                                     "large a trace to hold in memory")
                self.index[(node, key)] = child
                self.parent.append(node)
                self.depth.append(len(out) + 1)
            out.append(child)
            node = child
        return out


def full_blocks(tokens: Sequence[int], block_size: int) -> list[tuple[int, ...]]:
    """The full ``block_size``-token blocks of a prompt, root first; the trailing partial
    block is not cacheable (as in vLLM)."""
    return [tuple(tokens[i:i + block_size])
            for i in range(0, len(tokens) // block_size * block_size, block_size)]


def _build(name: str, trie: _Trie, paths: Sequence[Sequence[int]],
           timestamps: Sequence[float] | np.ndarray, input_tokens: Sequence[int] | np.ndarray,
           block_size: int) -> Trace:
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=offsets[1:])
    nodes = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths]) if paths else (
        np.zeros(0, dtype=np.int64))
    return Trace(name=name, parent=np.asarray(trie.parent, dtype=np.int64),
                 depth=np.asarray(trie.depth, dtype=np.int64), offsets=offsets, nodes=nodes,
                 timestamps=np.asarray(timestamps, dtype=np.float64),
                 input_tokens=np.asarray(input_tokens, dtype=np.int64), block_size=block_size)


def from_paths(paths: Iterable[Sequence[object] | np.ndarray], *, name: str = "trace",
               block_size: int = MOONCAKE_BLOCK_TOKENS,
               timestamps: Sequence[float] | np.ndarray | None = None,
               input_tokens: Sequence[int] | np.ndarray | None = None) -> Trace:
    """A trace from chains of block keys (any hashable; a key means its whole prefix)."""
    trie = _Trie()
    chained = [trie.chain(p) for p in paths]
    n = len(chained)
    ts = np.arange(n, dtype=np.float64) if timestamps is None else timestamps
    tokens = [len(p) * block_size for p in chained] if input_tokens is None else input_tokens
    if len(ts) != n or len(tokens) != n:
        raise ValueError(f"timestamps and input_tokens need one entry per request ({n})")
    return _build(name, trie, chained, ts, tokens, block_size)


def _rows(file: Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed JSON)`` for each non-blank line of ``file``."""
    return jsonl_rows(file, objects=False, max_bytes=MAX_TRACE_BYTES, what="trace")


def _int_list(file: Path, lineno: int, value: object, field: str, most: int) -> list[int]:
    if not isinstance(value, list) or not all(
            type(x) is int and x >= 0 for x in value):
        raise bad_line(file, lineno, f"{field} must be a list of integers >= 0")
    if len(value) > most:
        raise bad_line(file, lineno, f"{len(value):,} {field} in one request, more than "
                                     f"{most:,}")
    return value


def _number(file: Path, lineno: int, row: dict, field: str) -> float:
    value = row.get(field)
    try:
        return check_nonnegative(value, field)
    except (TypeError, ValueError):
        raise bad_line(file, lineno, f"{field} must be a finite number >= 0, "
                                     f"got {value!r}") from None


def _in_order(file: Path, lineno: int, stamps: list[float], stamp: float) -> float:
    if stamps and stamp < stamps[-1]:
        raise bad_line(file, lineno, f"timestamp {stamp:g} is before the previous request's "
                                      f"({stamps[-1]:g}); a trace must be in time order")
    return stamp


def _block_ids(file: Path, lineno: int, value: object) -> list[int | str]:
    """``hash_ids``: integers, or strings (the prefix-hash format some gateways log)."""
    if not isinstance(value, list) or not all(
            (type(x) is int and x >= 0) or
            (isinstance(x, str) and x) for x in value):
        raise bad_line(file, lineno, "hash_ids must be a list of integers >= 0 or of "
                                     "non-empty strings")
    if len(value) > MAX_REQUEST_BLOCKS:
        raise bad_line(file, lineno, f"{len(value):,} hash_ids in one request, more than "
                                     f"{MAX_REQUEST_BLOCKS:,}")
    return value


def iter_mooncake(file: str | Path) -> Iterator[tuple[float, int, list[int | str]]]:
    """``(timestamp, input_length, hash_ids)`` of each request of a Mooncake JSONL trace, read
    lazily (a stream of any length in constant memory). Raises :class:`ValueError` naming the
    file and line of the first malformed request."""
    file = Path(file)
    last = None
    for lineno, row in _rows(file):
        if not isinstance(row, dict):
            raise bad_line(file, lineno, "expected a JSON object")
        missing = [k for k in ("timestamp", "input_length", "hash_ids") if k not in row]
        if missing:
            raise bad_line(file, lineno, f"missing field(s) {', '.join(missing)}")
        hashes = _block_ids(file, lineno, row["hash_ids"])
        last = _in_order(file, lineno, [] if last is None else [last],
                         _number(file, lineno, row, "timestamp"))
        tokens = int(_number(file, lineno, row, "input_length"))
        if "output_length" in row:
            _number(file, lineno, row, "output_length")
        yield last, tokens, hashes


def load_mooncake(file: str | Path, *, name: str | None = None) -> Trace:
    """Read a Mooncake JSONL trace (conversation, synthetic or tool-agent; 512-token blocks;
    block ids integers or strings).

    Raises :class:`ValueError` naming the file and line of the first malformed request.
    """
    file = Path(file)
    trie = _Trie()
    paths: list[array] = []
    timestamps: list[float] = []
    tokens: list[int] = []
    for stamp, length, hashes in iter_mooncake(file):
        timestamps.append(stamp)
        tokens.append(length)
        paths.append(trie.chain(hashes))
    if not paths:
        raise ValueError(f"{file}: no requests")
    return _build(name or file.stem, trie, paths, timestamps, tokens, MOONCAKE_BLOCK_TOKENS)


def load_prompt_log(file: str | Path, *, block_size: int = 16, name: str | None = None) -> Trace:
    """Read a prompt log: one request a line, a JSON list of token ids or an object with
    ``tokens`` (or ``token_ids``) and an optional ``timestamp`` (ms; when absent, the request's
    index or the previous timestamp, whichever is later). Tokens are chained into
    blocks of ``block_size``; the trailing partial block is not cacheable (as in vLLM)."""
    check_count(block_size, "block_size")
    file = Path(file)
    trie = _Trie()
    paths: list[array] = []
    timestamps: list[float] = []
    tokens: list[int] = []
    for lineno, row in _rows(file):
        stamp = max(float(len(paths)), timestamps[-1] if timestamps else 0.0)  # none given
        if isinstance(row, dict):
            ids = row.get("tokens", row.get("token_ids"))
            if ids is None:
                raise bad_line(file, lineno, "object needs a tokens (or token_ids) list")
            if "timestamp" in row:
                stamp = _number(file, lineno, row, "timestamp")
        else:
            ids = row
        ids = _int_list(file, lineno, ids, "tokens", MAX_REQUEST_BLOCKS * block_size)
        paths.append(trie.chain(full_blocks(ids, block_size)))
        timestamps.append(_in_order(file, lineno, timestamps, stamp))
        tokens.append(len(ids))
    if not paths:
        raise ValueError(f"{file}: no requests")
    return _build(name or file.stem, trie, paths, timestamps, tokens, block_size)


def resolve(name_or_path: str | Path, *, block_size: int | None = None) -> Trace:
    """``conversation``/``synthetic``/``toolagent`` (via :func:`canopy.data.path`) or a file.

    A ``.jsonl`` file whose first request has ``hash_ids`` is read as Mooncake, anything else
    as a prompt log with ``block_size`` tokens a block (default 16).
    """
    key = str(name_or_path)
    if key in TRACE_FILES:
        try:
            file = data.path("mooncake", TRACE_FILES[key])
        except data.DataNotFound as missing:
            if key != "toolagent":
                raise
            raise data.DataNotFound(
                f"{missing}. The tool-agent trace is not mirrored: download "
                "FAST25-release/traces/toolagent_trace.jsonl from github.com/kvcache-ai/Mooncake "
                "into $CANOPY_DATA_DIR/mooncake/ (or pass download=True to canopy.data.path), "
                "or pass its file path as the trace") from None
        return load_mooncake(file, name=key)
    file = Path(key)
    if not os.path.lexists(file):
        raise ValueError(f"trace must be one of {', '.join(TRACE_FILES)} or an existing "
                         f"file, got {key!r}")
    if _looks_mooncake(file):
        return load_mooncake(file)
    return load_prompt_log(file, block_size=16 if block_size is None else block_size)


def _looks_mooncake(file: Path) -> bool:
    for _, row in _rows(file):
        return isinstance(row, dict) and "hash_ids" in row
    return False


def shifted(before: Trace, after: Trace) -> tuple[Trace, int]:
    """The popularity-shift scenario: ``before``'s requests, then ``after``'s in a disjoint
    block space. Returns the joined trace and the index of the first post-shift request."""
    if before.block_size != after.block_size:
        raise ValueError(f"block sizes differ: {before.block_size} and {after.block_size}")
    shift = before.n_nodes
    parent = np.concatenate([before.parent, np.where(after.parent < 0, -1, after.parent + shift)])
    last = before.timestamps[-1] if before.n_requests else 0.0
    joined = Trace(
        name=f"{before.name}->{after.name}", parent=parent,
        depth=np.concatenate([before.depth, after.depth]),
        offsets=np.concatenate([before.offsets, after.offsets[1:] + before.offsets[-1]]),
        nodes=np.concatenate([before.nodes, after.nodes + shift]),
        timestamps=np.concatenate([before.timestamps, after.timestamps + last]),
        input_tokens=np.concatenate([before.input_tokens, after.input_tokens]),
        block_size=after.block_size)
    return joined, before.n_requests
