"""Peak memory of a streaming replay: one Mooncake trace vs the trace concatenated ``copies``
times with disjoint block ids (strings ``"copy:hash"``, the prefix-hash format gateways log).

    python benchmarks/cache_memory.py --trace conversation --capacity 4096 --copies 1 10

Each replay runs in a fresh process (peak RSS is per process); prints one JSON line per run
with the peak RSS, the nodes the cache holds at the end, and blocks reused per request of each
copy (the copies are disjoint, so every copy after the first is a popularity shift).
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
    from canopy.apps.cache.stream import StreamingCache
    from canopy.apps.cache.traces import TRACE_FILES, iter_mooncake

    file = data.path("mooncake", TRACE_FILES[trace])
    cache = StreamingCache(policy, capacity, history_floor=floor)
    per_copy = []
    for copy in range(copies):
        reused = [cache.request([f"{copy}:{h}" for h in hashes])
                  for _, _, hashes in iter_mooncake(file)]
        per_copy.append(float(np.mean(reused)))
    print(json.dumps({"trace": trace, "policy": policy, "capacity": capacity, "copies": copies,
                      "history_floor": floor,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "nodes": cache.n_nodes, "forgotten": cache.forgotten,
                      "reused_per_copy": per_copy}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="conversation")
    parser.add_argument("--policy", default="canopy")
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--no-floor", action="store_true", help="keep every node ever seen")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    floor = None if args.no_floor else 0.5
    if args.child:
        _child(args.trace, args.policy, args.capacity, args.copies[0], floor)
        return
    for copies in args.copies:
        command = [sys.executable, __file__, "--child", "--trace", args.trace, "--policy",
                   args.policy, "--capacity", str(args.capacity), "--copies", str(copies)]
        subprocess.run(command + (["--no-floor"] if args.no_floor else []), check=True)


if __name__ == "__main__":
    main()
