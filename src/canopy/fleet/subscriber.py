"""A gateway's subscription to its replicas' KV events (vLLM's ``--kv-events-config``).

Per replica the gateway binds a ZMQ SUB socket on the configured endpoint (loopback unless
allowed otherwise; the engine connects to it) and reads only the configured topic. Each
multipart message ``(topic, 8-byte sequence number, msgpack EventBatch)``
(:mod:`canopy.fleet.events`) is checked: an oversized, malformed or foreign message is
dropped and counted, never raised. ``BlockStored`` blocks are keyed by their token ids
(:func:`canopy.fleet.tokens.chain_keys`), the keys the gateway computes for a request, so
the index matches whatever hash algorithm and seed the engine uses.

A sequence gap is replayed from the engine's replay socket (a ROUTER: send
``(b"", first missing seq)``, receive ``(b"", seq, payload)`` until seq -1); when there is
none, or it does not answer, the replica's events can no longer be trusted and the host
drops to ``approximate`` (``EventSubscriber.on_gap_lost``), logged once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from canopy.fleet import events as wire
from canopy.fleet.index import ReplicaIndex
from canopy.fleet.tokens import chain_keys

__all__ = ["END_SEQ", "EventSource", "EventSubscriber", "TokenKeys", "is_loopback"]

log = logging.getLogger("canopy.fleet.events")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence number that ends a replay."""
REPLAY_TIMEOUT_S = 1.0


def is_loopback(endpoint: str) -> bool:
    """Whether a ZMQ endpoint stays on this machine (``ipc://``, ``inproc://`` or a
    loopback TCP host)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


@dataclass(frozen=True)
class EventSource:
    """Where one replica's events come from."""

    replica: int
    endpoint: str
    topic: str = ""
    replay_endpoint: str | None = None
    block_size: int = 16


@dataclass
class TokenKeys:
    """One replica's map from the engine's block hashes to the gateway's token keys."""

    block_size: int
    keys: dict[int, int] = field(default_factory=dict)

    def apply(self, index: ReplicaIndex, replica: int,
              batch: Iterable[Mapping[str, Any]]) -> None:
        """Apply one batch's events (raises ``ValueError``/``KeyError``/``TypeError`` on a
        malformed event, after applying the ones before it)."""
        for event in batch:
            kind = event.get("type") if isinstance(event, Mapping) else None
            if kind == "BlockStored":
                hashes = [wire.fold(h) for h in event["block_hashes"]]
                size = int(event.get("block_size") or self.block_size)
                parent = event.get("parent_block_hash")
                parent_key = 0 if parent is None else self.keys.get(wire.fold(parent))
                if parent_key is None:
                    raise ValueError("BlockStored under a parent block never stored")
                ours = chain_keys(event["token_ids"], size, parent_key)
                if ours.size != len(hashes):
                    raise ValueError(f"BlockStored: {len(hashes)} hashes for {ours.size} "
                                     "blocks of tokens")
                self.keys.update(zip(hashes, ours.tolist(), strict=True))
                index.stored(replica, ours, None if parent is None else parent_key)
            elif kind == "BlockRemoved":
                gone = [self.keys.pop(h) for h in map(wire.fold, event["block_hashes"])
                        if h in self.keys]
                index.removed(replica, np.asarray(gone, dtype=np.int64))
            elif kind == "AllBlocksCleared":
                self.keys.clear()
                index.cleared(replica)
            else:
                raise ValueError(f"unknown KV event {kind!r}")


class EventSubscriber:
    """Reads the events of ``sources`` into ``index`` on the running event loop.

    ``dropped`` counts dropped messages by reason; ``lag_s[replica]`` is the age of the
    newest batch applied (its timestamp to now); ``on_gap_lost(replica)`` is called when a
    gap cannot be replayed (the host drops to approximate)."""

    def __init__(self, index: ReplicaIndex, sources: Iterable[EventSource], *,
                 max_bytes: int = 4 << 20, allow_remote: bool = False,
                 on_gap_lost: Callable[[int], None] | None = None,
                 on_drop: Callable[[str], None] | None = None) -> None:
        self.index = index
        self.sources = tuple(sources)
        for source in self.sources:
            if not allow_remote and not is_loopback(source.endpoint):
                raise ValueError(f"events endpoint {source.endpoint!r} is not loopback "
                                 "(set allow_remote_events to accept it)")
        self.max_bytes = max_bytes
        self.on_gap_lost = on_gap_lost
        self.on_drop = on_drop
        self.dropped: Counter[str] = Counter()
        self.lag_s = {s.replica: 0.0 for s in self.sources}
        self.tokens = {s.replica: TokenKeys(s.block_size) for s in self.sources}
        self.lost = False
        self._logged: set[str] = set()
        self._context: Any = None
        self._sockets: list[tuple[Any, EventSource]] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Bind the sockets and start reading (call on the event loop)."""
        import zmq
        import zmq.asyncio

        self._context = zmq.asyncio.Context()
        for source in self.sources:
            sock = self._context.socket(zmq.SUB)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_bytes)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt_string(zmq.SUBSCRIBE, source.topic)
            sock.bind(source.endpoint)
            self._sockets.append((sock, source))
            self._tasks.append(asyncio.get_running_loop().create_task(
                self._read(sock, source)))

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    def _drop(self, reason: str, source: EventSource, detail: str = "") -> None:
        self.dropped[reason] += 1
        if self.on_drop is not None:
            self.on_drop(reason)
        self._once(f"{reason}:{source.replica}", "KV events of replica %d (%s): %s message "
                   "dropped %s(logged once; counted in /metrics)", source.replica,
                   source.endpoint, reason, detail)

    async def _read(self, sock: Any, source: EventSource) -> None:
        while True:
            try:
                frames = await sock.recv_multipart()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a closed context ends the reader
                log.debug("events reader of replica %d ends: %r", source.replica, error)
                return
            self.handle(source, frames)

    def handle(self, source: EventSource, frames: list[bytes]) -> None:
        """One message from ``source``'s socket (never raises)."""
        if len(frames) != 3:
            return self._drop("malformed", source, "(not 3 frames) ")
        topic, seq_frame, payload = frames
        if source.topic and topic != source.topic.encode():
            return self._drop("topic", source)
        if len(payload) > self.max_bytes:
            return self._drop("oversized", source)
        if self.lost:
            return None
        try:
            seq = wire.sequence_number(seq_frame)
        except ValueError:
            return self._drop("malformed", source, "(sequence number) ")
        last = int(self.index.last_seq[source.replica])
        if seq <= last:
            return self._drop("duplicate", source)
        if last >= 0 and seq > last + 1:
            self._once(f"gap:{source.replica}", "KV events of replica %d: sequence gap "
                       "%d..%d (logged once)", source.replica, last + 1, seq - 1)
            asyncio.get_running_loop().create_task(self._replay(source, last + 1))
            return None
        self.index.last_seq[source.replica] = seq  # a malformed batch is skipped, not a gap
        try:
            ts, batch = wire.decode(payload)
        except Exception as error:
            return self._drop("malformed", source, f"({type(error).__name__}) ")
        self._apply(source, seq, ts, batch)
        return None

    def _apply(self, source: EventSource, seq: int, ts: float,
               batch: list[Mapping[str, Any]]) -> None:
        self.index.last_seq[source.replica] = seq
        try:
            self.tokens[source.replica].apply(self.index, source.replica, batch)
        except (ValueError, KeyError, TypeError) as error:
            self._drop("malformed", source, f"({type(error).__name__}) ")
            return
        self.lag_s[source.replica] = max(time.time() - ts, 0.0)

    async def _replay(self, source: EventSource, start: int) -> None:
        """Fetch the batches from ``start`` on from the replay socket; if that fails, the
        index drops to approximate."""
        if source.replay_endpoint is not None and await self._fetch(source, start):
            return
        if not self.lost:
            self.lost = True
            log.warning("KV events of replica %d: the gap could not be replayed; the "
                        "gateway's index drops to approximate", source.replica)
            if self.on_gap_lost is not None:
                self.on_gap_lost(source.replica)

    async def _fetch(self, source: EventSource, start: int) -> bool:
        import zmq

        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_bytes)
        try:
            sock.connect(source.replay_endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) != 3 or frames[1] == END_SEQ:
                    return int(self.index.last_seq[source.replica]) >= start
                seq = wire.sequence_number(frames[1])
                if seq > int(self.index.last_seq[source.replica]):
                    ts, batch = wire.decode(frames[2])
                    self._apply(source, seq, ts, batch)
        except Exception as error:
            log.warning("KV events of replica %d: replay from %s failed: %r",
                        source.replica, source.replay_endpoint, error)
            return False
        finally:
            sock.close()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        for sock, _ in self._sockets:
            sock.close()
        if self._context is not None:
            self._context.term()
