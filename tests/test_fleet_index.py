"""The replica index: the compact key index against a dict, KV events with sequence numbers
(duplicates, gaps, AllBlocksCleared), freeing, the approximate index's expiry and TTL
calibration, and memory that grows with blocks, not blocks x replicas."""

from __future__ import annotations

import numpy as np
import pytest

from canopy.fleet import ReplicaIndex
from canopy.prefix.hashindex import KeyTree, fold, fold_all


def test_key_tree_agrees_with_a_dict_under_inserts_and_frees():
    rng = np.random.default_rng(0)
    tree, truth = KeyTree(4), {}
    keys = rng.integers(0, 300, size=6000).tolist()  # few keys: long probe chains, many reuses
    for key in keys:
        if rng.random() < 0.45 and key in truth:
            tree.free([truth.pop(key)])
        else:
            node = int(tree.chain([key])[0])
            assert truth.setdefault(key, node) == node  # a key keeps its node
    assert len(tree) == len(truth) and len(set(truth.values())) == len(truth)
    assert all(tree.get(k) == v for k, v in truth.items())
    assert all(tree.get(k) == -1 for k in range(300) if k not in truth)
    assert tree.n <= 300  # freed ids are handed out again


def test_key_tree_by_parent_finds_a_key_under_its_parent():
    tree = KeyTree(by_parent=True)
    a = tree.chain(["x", "y", "z"])
    b = tree.chain(["x", "z", "y"])  # "z" under "x" is another block than "z" under "y"
    assert a[0] == b[0] and len(set(a.tolist()) | set(b.tolist())) == 5
    nodes, lead = tree.find(["x", "y", "q", "z"])
    assert lead == 2 and nodes.tolist() == [a[0], a[1], -1, -1]
    assert tree.parent[a].tolist() == [-1, a[0], a[1]]


def test_fold_takes_ints_digests_and_other_keys():
    assert fold(5) == 5 and fold(-1) == 2 ** 63 - 1
    assert fold(bytes(range(32))) == int.from_bytes(bytes(range(8)), "big")
    digests = [bytes(range(i, i + 36)) for i in range(5)]  # one numpy pass, the same fold
    mixed = [3, -7, 2 ** 64 - 1, b"ab", "root", (1, 2), 2.0]
    for keys in (digests, mixed, [1, 2, 3], np.array([4, -5])):
        assert fold_all(keys).tolist() == [fold(k) for k in keys]
    assert fold(2.0) == fold(2) and fold(b"ab") != fold(b"abc")


def test_events_build_and_shrink_the_replica_sets():
    index = ReplicaIndex(4)
    index.stored(0, [10, 11, 12])
    index.stored(2, [10, 11, 12, 13, 14])
    index.stored(1, [10, 11])
    assert index.match([10, 11, 12, 13, 99]).tolist() == [3, 2, 4, 0]
    assert index.n_blocks == 5 and index.holders(11) == [0, 1, 2]
    index.removed(2, [14, 13, 12])  # 13, 14 held by nobody now: freed
    assert index.n_blocks == 3 and index.match([10, 11, 12, 13]).tolist() == [3, 2, 2, 0]
    index.cleared(0)  # AllBlocksCleared
    assert index.n_blocks == 2 and index.holders(12) == []
    assert index.match([10, 11, 12]).tolist() == [0, 2, 2, 0]
    index.removed(3, [10, 77])  # a block a replica never held, a key never seen: no effect
    assert index.match([10, 11]).tolist() == [0, 2, 2, 0]


def test_a_chain_is_matched_up_to_each_replicas_first_miss():
    index = ReplicaIndex(3)
    index.stored(0, [1, 2, 3])
    index.stored(1, [1, 5, 6])  # 5 under 1, not 2
    index.stored(1, [2, 3])
    assert index.match([1, 2, 3]).tolist() == [3, 3, 0]
    index.removed(1, [1])
    assert index.match([1, 2, 3]).tolist() == [3, 0, 0]  # a hole at the root ends the match
    assert index.match([1, 5, 6]).tolist() == [1, 0, 0]


def test_sequence_numbers_drop_duplicates_and_record_gaps():
    index = ReplicaIndex(2)
    assert index.sequence(0, 0) and index.sequence(0, 1)
    assert not index.sequence(0, 1) and not index.sequence(0, 0)  # replayed: dropped
    assert index.sequence(0, 5)  # 2..4 missing
    assert index.gaps == [(0, 2, 5)]
    assert index.sequence(1, 7) and index.gaps == [(0, 2, 5)]  # a replica's first batch
    with pytest.raises(ValueError, match="replica"):
        index.sequence(2, 0)


def test_freed_nodes_are_reused_so_memory_follows_the_live_blocks():
    index = ReplicaIndex(8, capacity=64)
    rng = np.random.default_rng(1)
    for _ in range(200):  # 200 rounds of 64 blocks stored then removed
        chain = rng.integers(1, 2 ** 62, size=64)
        replica = int(rng.integers(8))
        index.stored(replica, chain)
        index.removed(replica, chain)
    assert index.n_blocks == 0
    assert index.mask.size <= 128  # never more room than twice the live blocks


def test_memory_grows_with_blocks_not_replicas():
    sizes = {}
    for replicas in (2, 64):
        index = ReplicaIndex(replicas)
        chains = np.arange(1, 20_001).reshape(-1, 20)
        for chain in chains:
            for r in range(replicas):  # every replica holds every block
                index.stored(r, chain)
        assert index.n_blocks == 20_000
        sizes[replicas] = index.nbytes
    # the same bytes at 2 and 64 replicas: a node's key, parent and mask per node of room
    # (room doubles as blocks arrive) and a 4-byte slot of the key index (two to four a node)
    assert sizes[64] == sizes[2]
    room = ReplicaIndex(2)
    room.stored(0, np.arange(1, 20_001))
    assert room.nbytes == sizes[2] and room.nbytes / room.mask.size <= 8 + 8 + 8 + 4 * 4


def test_approximate_entries_expire_and_the_ttl_follows_reports():
    index = ReplicaIndex(3, mode="approximate", ttl_s=10.0)
    index.sent(0, [1, 2, 3], now=0.0)
    index.sent(1, [1, 2], now=5.0)
    assert index.match([1, 2, 3], now=6.0).tolist() == [3, 2, 0]
    assert index.match([1, 2, 3], now=12.0).tolist() == [2, 2, 0]  # block 3 expired
    assert index.match([1, 2, 3], now=16.0).tolist() == [0, 0, 0]
    index.sent(2, [1], now=20.0)  # an expired node forgets its old replicas
    assert index.match([1], now=20.0).tolist() == [0, 0, 1]
    assert index.expire(now=100.0) == 3 and index.n_blocks == 0
    for _ in range(20):  # engines keep reporting less than the index predicts
        index.reported(predicted_blocks=4, cached_blocks=1)
    assert index.ttl_s < 10.0 * 0.95 ** 19
    ttl = index.ttl_s
    index.reported(predicted_blocks=1, cached_blocks=4)
    assert index.ttl_s > ttl
    with pytest.raises(ValueError, match="approximate"):
        ReplicaIndex(2).sent(0, [1], now=0.0)


def test_vllm_event_batches_feed_the_index():
    msgpack = pytest.importorskip("msgpack")
    from canopy.fleet import events

    digest = bytes(range(32))  # a sha256 block hash
    stored = {"type": "BlockStored", "block_hashes": [11, 12, digest], "parent_block_hash": None,
              "token_ids": list(range(48)), "block_size": 16, "lora_id": None, "medium": "GPU"}
    payload = msgpack.packb([1.5, [stored]])
    ts, batch = events.decode(payload)
    index = ReplicaIndex(2)
    seq = events.sequence_number((7).to_bytes(8, "big"))
    assert ts == 1.5 and events.apply(index, 1, seq, batch)
    assert index.match([11, 12, events.fold(digest)]).tolist() == [0, 3]
    assert not events.apply(index, 1, 7, batch)  # the same batch again: a duplicate
    removed = {"type": "BlockRemoved", "block_hashes": [digest], "medium": "GPU"}
    assert events.apply(index, 1, 9, [removed]) and index.gaps == [(1, 8, 9)]
    assert index.match([11, 12, events.fold(digest)]).tolist() == [0, 2]
    assert events.apply(index, 1, 10, [{"type": "AllBlocksCleared"}]) and index.n_blocks == 0
    with pytest.raises(ValueError, match="unknown KV event"):
        events.apply(index, 1, 11, [{"type": "Nope"}])
    with pytest.raises(ValueError, match="event batch"):
        events.decode(msgpack.packb({"ts": 1}))
