"""What Canopy's eviction costs vLLM's scheduler, per request, in-process.

vLLM's own ``KVCacheManager`` (as ``tests/vllm_pool_driver.py`` drives it: look the prefix up,
allocate, cache, free; no server, no model) serves prompts of 128 blocks of 16 tokens that
share prefixes (a Zipf choice among 64 documents of 96 blocks, then 32 blocks of the request's
own), so the pool hits, evicts and hits again. Each configuration runs in a fresh process:
vLLM with the plugin unset, then with ``CANOPY_VLLM_EVICTION`` set to each policy asked for.
After a warm-up (numba's kernels compiled or loaded) the requests are timed one at a time
with ``time.perf_counter``; the median and mean per request are printed for each pool size
(the prompts are made and hashed before the timing, then frozen for the garbage collector, as
vLLM's engine freezes its start-up objects).

Run with vLLM's interpreter (the project's ``.venv-vllm``), Canopy's sources on the path::

    PYTHONPATH=src .venv-vllm/bin/python benchmarks/vllm_scheduler_cost.py \\
        --pools 1000,10000 --policies canopy,lru --requests 2000

The figure is the difference per request against ``vllm`` (the plugin unset) in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

BLOCK = 16
PROMPT_BLOCKS = 128
SHARED_BLOCKS = 96
DOCUMENTS = 64


def _prompts(n: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        doc = min(int(rng.paretovariate(1.0)) - 1, DOCUMENTS - 1)
        shared = [1 + doc * 100_000 + t for t in range(SHARED_BLOCKS * BLOCK)]
        own = [10_000_000 + i * 10_000 + t for t in range((PROMPT_BLOCKS - SHARED_BLOCKS) * BLOCK)]
        out.append(shared + own)
    return out


def _serve(policy: str, blocks: int, warm: int, timed: int, seed: int) -> dict:
    """One configuration, in this process: per-request seconds of the timed requests."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    if policy != "vllm":
        os.environ["CANOPY_VLLM_EVICTION"] = policy
        from canopy.integrations.vllm import register

        register()  # the entry point, as vLLM calls it
    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    manager = KVCacheManager(config, max_model_len=(PROMPT_BLOCKS + 1) * BLOCK,
                             scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                             enable_caching=True)
    hasher = get_request_block_hasher(BLOCK, sha256)
    prompts = _prompts(warm + timed, seed)
    requests = [Request(str(i), p, SamplingParams(max_tokens=1), None, block_hasher=hasher)
                for i, p in enumerate(prompts)]  # hashing the prompt is not timed
    # a server holds only the requests in flight, and vLLM's engine freezes what it made at
    # start-up: the requests made here in advance are frozen, or the collector's passes over
    # them would land in the timed requests of whichever configuration allocates most
    gc.collect()
    gc.freeze()
    seconds, hits = [], 0
    for i, request in enumerate(requests):
        began = time.perf_counter()
        computed, hit, _ = manager.get_computed_blocks(request)
        new = manager.allocate_slots(request, len(request.prompt_token_ids) - hit, hit,
                                     computed)
        assert new is not None, "the pool cannot hold one request"
        request.num_computed_tokens = len(request.prompt_token_ids)
        manager.cache_blocks(request, len(request.prompt_token_ids))
        manager.free(request)
        if i >= warm:
            seconds.append(time.perf_counter() - began)
            hits += hit
    return {"policy": policy, "blocks": blocks, "median_ms": 1e3 * statistics.median(seconds),
            "mean_ms": 1e3 * statistics.fmean(seconds),
            "hit_blocks_per_request": hits / BLOCK / timed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default="1000,10000")
    parser.add_argument("--policies", default="canopy,lru")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: policy,blocks
    args = parser.parse_args()
    if args.one:
        policy, blocks = args.one.split(",")
        print(json.dumps(_serve(policy, int(blocks), args.warm, args.requests, args.seed)))
        return
    rows = []
    for blocks in (int(b) for b in args.pools.split(",")):
        for policy in ["vllm", *args.policies.split(",")]:
            env = {k: v for k, v in os.environ.items() if k != "CANOPY_VLLM_EVICTION"}
            child = subprocess.run(
                [sys.executable, __file__, "--one", f"{policy},{blocks}", "--requests",
                 str(args.requests), "--warm", str(args.warm), "--seed", str(args.seed)],
                capture_output=True, text=True, check=True, env=env)
            row = json.loads(child.stdout.strip().splitlines()[-1])
            rows.append(row)
            base = next(r for r in rows if r["blocks"] == blocks and r["policy"] == "vllm")
            print(f"pool {blocks:>6} {policy:>7}: median {row['median_ms']:.3f} ms, mean "
                  f"{row['mean_ms']:.3f} ms a request (over vLLM: median "
                  f"{row['median_ms'] - base['median_ms']:+.3f}, mean "
                  f"{row['mean_ms'] - base['mean_ms']:+.3f} ms); hit "
                  f"{row['hit_blocks_per_request']:.1f} blocks a request", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
