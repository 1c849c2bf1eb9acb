"""Engines' KV events into the replica index: vLLM's ``distributed/kv_events.py`` wire format.

A ZMQ multipart message is ``(topic, sequence number as 8 bytes big-endian, payload)``; the
payload is a msgpack ``EventBatch``, an array ``[ts, events, data_parallel_rank?]`` whose
events are tagged maps: ``{"type": "BlockStored", "block_hashes": [...],
"parent_block_hash": h | None, "token_ids": [...], "block_size": n, ...}``,
``{"type": "BlockRemoved", "block_hashes": [...], ...}``, ``{"type": "AllBlocksCleared"}``.
Block hashes are ints or bytes (sha256 digests), folded to int64 keys by
:func:`canopy.prefix.hashindex.fold`. msgpack is imported when a payload is decoded (the
``fleet`` extra)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from canopy.fleet.index import ReplicaIndex
from canopy.prefix.hashindex import fold

__all__ = ["apply", "decode", "fold", "sequence_number"]


def sequence_number(frame: bytes) -> int:
    """The batch's sequence number (the multipart message's second frame)."""
    if len(frame) != 8:
        raise ValueError(f"a sequence number is 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def decode(payload: bytes) -> tuple[float, list[Mapping[str, Any]]]:
    """``(timestamp, events)`` of one msgpack ``EventBatch``."""
    try:
        import msgpack
    except ImportError as missing:
        raise ImportError("decoding KV events needs msgpack: pip install "
                          "'canopy-bandits[fleet]'") from missing
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or \
            not isinstance(batch[1], (list, tuple)):
        raise ValueError("not a KV event batch: expected [ts, events, ...]")
    return float(batch[0]), list(batch[1])


def _keys(hashes: Iterable[int | bytes]) -> np.ndarray:
    return np.fromiter((fold(h) for h in hashes), dtype=np.int64)


def apply(index: ReplicaIndex, replica: int, seq: int,
          events: Iterable[Mapping[str, Any]]) -> bool:
    """Apply one batch of ``replica``'s events; False (nothing applied) for a duplicate.
    A gap before it is recorded in ``index.gaps`` (ask the engine's replay socket)."""
    if not index.sequence(replica, seq):
        return False
    for event in events:
        kind = event.get("type") if isinstance(event, Mapping) else None
        if kind == "BlockStored":
            parent = event.get("parent_block_hash")
            index.stored(replica, _keys(event["block_hashes"]),
                         None if parent is None else fold(parent))
        elif kind == "BlockRemoved":
            index.removed(replica, _keys(event["block_hashes"]))
        elif kind == "AllBlocksCleared":
            index.cleared(replica)
        else:
            raise ValueError(f"unknown KV event {kind!r}")
    return True
