"""Peak memory of the cache's replays against trace length.

Streaming cache: one Mooncake trace vs the trace concatenated ``copies`` times with disjoint
block ids (strings ``"copy:hash"``, the prefix-hash format gateways log)::

    python benchmarks/cache_memory.py --trace conversation --capacity 4096 --copies 1 10

prints per run the peak RSS, the nodes the cache holds at the end, and blocks reused per
request of each copy (the copies are disjoint, so every copy after the first is a popularity
shift).

Offline replay (:class:`~canopy.prefix.RadixCache`) of Mooncake-shaped traces of
``--refs`` block references (the mirror's trace tiled with disjoint node ids, the last copy a
prefix of it), every policy of ``--policies`` at each length, side by side::

    python benchmarks/cache_memory.py --trace conversation --capacity 1024 \
        --refs 1e4 1e5 1e6 1e7 --policies lru sieve canopy

prints per run the peak RSS, the RSS before the trace was built (interpreter, libraries,
compiled kernels), the trace's own arrays, ``bytes_per_ref`` (the peak of the memory
allocated from building the trace on, trace included, as ``tracemalloc`` counts numpy's
arrays, over the references) and the replay's speed (block references per CPU second).

Each run is a fresh process (peak RSS is per process).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def _child(trace: str, policy: str, capacity: int, copies: int, floor: float | None) -> None:
    import numpy as np

    from canopy import data
    from canopy.prefix.stream import StreamingCache
    from canopy.prefix.traces import TRACE_FILES, iter_mooncake

    file = data.path("mooncake", TRACE_FILES[trace])
    cache = StreamingCache(policy, capacity, history_floor=floor)
    per_copy = []
    for copy in range(copies):
        reused = [cache.request([f"{copy}:{h}" for h in hashes])
                  for _, _, hashes in iter_mooncake(file)]
        per_copy.append(float(np.mean(reused)))
    print(json.dumps({"trace": trace, "policy": policy, "capacity": capacity, "copies": copies,
                      "history_floor": floor,
                      "peak_rss_mb": _peak_mb(),
                      "nodes": cache.n_nodes, "forgotten": cache.forgotten,
                      "reused_per_copy": per_copy}))


def tiled(trace, refs: int):
    """A trace of about ``refs`` block references shaped like ``trace``: whole copies of it with
    disjoint node ids, then the prefix of it that reaches ``refs``."""
    import numpy as np

    from canopy.prefix.traces import Trace

    whole, rest = divmod(refs, trace.n_refs)
    part = trace.head(int(np.searchsorted(trace.offsets, rest))) if rest else None
    pieces = [trace] * whole + ([part] if part is not None and part.n_requests else [])
    n_nodes = sum(p.n_nodes for p in pieces)
    n_refs = sum(p.n_refs for p in pieces)
    n_req = sum(p.n_requests for p in pieces)
    parent = np.empty(n_nodes, dtype=np.int64)
    depth = np.empty(n_nodes, dtype=np.int64)
    nodes = np.empty(n_refs, dtype=np.int64)
    offsets = np.zeros(n_req + 1, dtype=np.int64)
    stamps = np.empty(n_req, dtype=trace.timestamps.dtype)
    tokens = np.empty(n_req, dtype=trace.input_tokens.dtype)
    v = r = q = 0
    for p in pieces:
        parent[v:v + p.n_nodes] = np.where(p.parent >= 0, p.parent + v, -1)
        depth[v:v + p.n_nodes] = p.depth
        nodes[r:r + p.n_refs] = p.nodes + v
        offsets[q + 1:q + p.n_requests + 1] = p.offsets[1:] + r
        stamps[q:q + p.n_requests] = p.timestamps
        tokens[q:q + p.n_requests] = p.input_tokens
        v, r, q = v + p.n_nodes, r + p.n_refs, q + p.n_requests
    return Trace(f"{trace.name} x {refs:g} refs", parent, depth, offsets, nodes, stamps, tokens,
                 trace.block_size)


def _replay_child(trace_name: str, policy: str, capacity: int, refs: int) -> None:
    import time
    import tracemalloc

    from canopy import data
    from canopy.prefix import RadixCache, make_policy
    from canopy.prefix.traces import TRACE_FILES, load_mooncake

    base = load_mooncake(data.path("mooncake", TRACE_FILES[trace_name]))
    RadixCache(tiled(base, 2000), make_policy(policy), capacity).run()  # load the kernels
    before = _peak_mb()
    tracemalloc.start()  # numpy reports its arrays to it: the trace's and the cache's bytes
    trace = tiled(base, refs)
    trace_mb = sum(a.nbytes for a in (trace.parent, trace.depth, trace.offsets, trace.nodes,
                                      trace.timestamps, trace.input_tokens)) / 2**20
    cache = RadixCache(trace, make_policy(policy), capacity)
    began = time.thread_time()
    reused = cache.run()
    cpu = time.thread_time() - began
    peak = _peak_mb()
    traced = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"trace": trace.name, "policy": policy, "capacity": capacity,
                      "refs": trace.n_refs, "nodes": trace.n_nodes, "peak_rss_mb": round(peak),
                      "rss_before_mb": round(before), "trace_mb": round(trace_mb),
                      "bytes_per_ref": round(traced / trace.n_refs, 1),
                      "block_refs_per_cpu_s": round(trace.n_refs / max(cpu, 1e-9)),
                      "blocks_reused": int(reused.sum())}), flush=True)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="conversation")
    parser.add_argument("--policy", default="canopy")
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--no-floor", action="store_true", help="keep every node ever seen")
    parser.add_argument("--refs", type=float, nargs="+",
                        help="offline replay at these trace lengths (block references)")
    parser.add_argument("--policies", nargs="+", default=["lru", "canopy"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    floor = None if args.no_floor else 0.5
    if args.refs:
        for refs in args.refs:
            for policy in ([args.policy] if args.child else args.policies):
                if args.child:
                    _replay_child(args.trace, policy, args.capacity, int(refs))
                    continue
                subprocess.run([sys.executable, __file__, "--child", "--trace", args.trace,
                                "--policy", policy, "--capacity", str(args.capacity),
                                "--refs", str(refs)], check=True)
        return
    if args.child:
        _child(args.trace, args.policy, args.capacity, args.copies[0], floor)
        return
    for copies in args.copies:
        command = [sys.executable, __file__, "--child", "--trace", args.trace, "--policy",
                   args.policy, "--capacity", str(args.capacity), "--copies", str(copies)]
        subprocess.run(command + (["--no-floor"] if args.no_floor else []), check=True)


if __name__ == "__main__":
    main()
