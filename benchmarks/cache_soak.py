"""Resident memory of the online policy over a long run, through each host's own adapter.

A request stream with no end in sight is fed, one request at a time, to the policy as each
engine hosts it, with no model: ``llama`` (the llama.cpp prompt cache,
``canopy.engines.llama_cache.PolicyStateCache``, asked for each prompt as llama-cpp-python asks
it), ``sglang`` (SGLang's own radix cache with Canopy's backend, served as its scheduler
serves a request, KV indices from a pool of the cache's size:
``canopy.apps.cache.sglang_replay.serve_request``) and ``vllm`` (vLLM's own
``KVCacheManager`` with the plugin installed, as ``tests/vllm_pool_driver.py`` drives it).
The stream: shared prefixes (``--prefixes``, default four a block of capacity: 4,096 at
1,024 blocks) of 2-8 blocks drawn by a Zipf(1.1) law whose ranking rotates every 50,000
requests, each request ending with a block of its own, so new blocks never stop arriving,
every request evicts and the policy must forget. The resident set size
(``/proc/self/statm``) is sampled ``--samples`` times through the run; the target is the
second half's largest sample within 5% of the sample at the first half's end.

Each host runs in its engine's interpreter, Canopy's sources on the path::

    PYTHONPATH=src .venv/bin/python benchmarks/cache_soak.py --host llama --requests 1000000
    PYTHONPATH=src .venv-sglang/bin/python benchmarks/cache_soak.py --host sglang \\
        --requests 1000000
    PYTHONPATH=src .venv-vllm/bin/python benchmarks/cache_soak.py --host vllm --requests 1000000

Each prints one JSON object; ``--out FILE`` writes it too, and rewrites it at every sample
while the run goes (``"done"``: the requests served so far), so a run stopped early leaves
its curve so far. ``--plot FILE.png A.json B.json ...`` draws the curves of earlier runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

PREFIXES_PER_BLOCK = 4
SHIFT_EVERY = 50_000
BLOCK = 16  # vLLM's tokens a block (the other hosts: one token a block)


def workload(requests: int, seed: int = 0, prefixes: int = 4096) -> Iterator[list[int]]:
    """Each request's block keys, root first (see the module docstring)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 9, size=prefixes)
    weights = 1.0 / np.arange(1, prefixes + 1) ** 1.1
    weights /= weights.sum()
    own = 16 * prefixes  # the requests' own blocks: above every prefix's keys
    for start in range(0, requests, SHIFT_EVERY):
        ranks = rng.choice(prefixes, size=min(SHIFT_EVERY, requests - start), p=weights)
        rotated = (ranks + (start // SHIFT_EVERY) * (prefixes // 8)) % prefixes
        for i, p in enumerate(rotated.tolist(), start):
            yield [1 + 16 * p + j for j in range(int(lengths[p]))] + [own + i]


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _llama(policy: str, capacity: int) -> Callable[[list[int]], int]:
    from canopy.engines.llama_cache import PolicyStateCache

    cache = PolicyStateCache(policy, capacity, block_tokens=1, kv_bytes=1)

    def serve(keys: list[int]) -> int:
        try:
            cache[keys]
        except KeyError:  # no state saved (no model): the engine would prefill
            pass
        return cache.reused[-1]

    return serve


def _sglang(policy: str, capacity: int) -> Callable[[list[int]], int]:
    from canopy.apps.cache.sglang_replay import serve_request, sglang_api

    api = sglang_api()
    cache = api.simulated("canopy", {"policy": policy, "capacity_blocks": capacity},
                          exact=True, size=capacity)
    return lambda keys: serve_request(api, cache, keys, capacity)


def _vllm(policy: str, capacity: int) -> Callable[[list[int]], int]:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    from canopy.integrations.vllm import install

    install(policy)
    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    config = KVCacheConfig(num_blocks=capacity + 2, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    manager = KVCacheManager(config, max_model_len=16 * BLOCK, scheduler_block_size=BLOCK,
                             hash_block_size=BLOCK, enable_caching=True)
    hasher = get_request_block_hasher(BLOCK, sha256)
    count = iter(range(2**62))

    def serve(keys: list[int]) -> int:
        prompt = [t for key in keys for t in [key] * BLOCK] + [1]  # a partial last block
        request = Request(str(next(count)), prompt, SamplingParams(max_tokens=1), None,
                          block_hasher=hasher)
        computed, hit, _ = manager.get_computed_blocks(request)
        manager.allocate_slots(request, len(prompt) - hit, hit, computed)
        request.num_computed_tokens = len(prompt)
        manager.cache_blocks(request, len(prompt))
        manager.free(request)
        return hit // BLOCK

    return serve


HOSTS = {"llama": _llama, "sglang": _sglang, "vllm": _vllm}


def soak(host: str, requests: int, *, policy: str = "canopy", capacity: int = 1024,
         prefixes: int | None = None, samples: int = 100, seed: int = 0,
         progress: Callable[[dict], None] | None = None) -> dict:
    """Feed ``requests`` requests through ``host``; RSS sampled ``samples`` times (each
    sample: ``progress`` of the report so far)."""
    prefixes = PREFIXES_PER_BLOCK * capacity if prefixes is None else prefixes
    serve = HOSTS[host](policy, capacity)
    every = max(1, requests // samples)
    curve: list[tuple[int, float]] = []
    reused, began = 0, time.perf_counter()
    report = {"host": host, "policy": policy, "capacity_blocks": capacity,
              "prefixes": prefixes, "requests": requests}
    for i, keys in enumerate(workload(requests, seed, prefixes), 1):
        reused += serve(keys)
        if i % every == 0 or i == requests:
            curve.append((i, round(_rss_mb(), 1)))
            report.update(_growth(curve, requests), done=i,
                          seconds=round(time.perf_counter() - began, 1),
                          blocks_reused_per_request=reused / i, curve=curve)
            if progress is not None:
                progress(report)
    return report


def _growth(curve: list[tuple[int, float]], requests: int) -> dict:
    """The target's figures from the samples so far (second half: ``None`` until reached)."""
    half = max((s for s in curve if s[0] <= requests // 2), key=lambda s: s[0], default=None)
    second = max((rss for i, rss in curve if i > requests // 2), default=None)
    if half is None or second is None:
        return {"rss_mb_first_half_end": half and half[1], "rss_mb_second_half_max": None,
                "growth": None, "within_5pct": None}
    return {"rss_mb_first_half_end": half[1], "rss_mb_second_half_max": second,
            "growth": round(second / half[1] - 1, 4), "within_5pct": second <= 1.05 * half[1]}


def plot(files: list[str], out: str) -> None:
    """The curves of earlier runs' JSON files, one line each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for file in files:
        run = json.loads(Path(file).read_text())
        x, y = zip(*run["curve"], strict=True)
        ax.plot(x, y, label=f"{run['host']}, {run['capacity_blocks']:,} blocks "
                            f"({run.get('done', run['requests']):,} requests)")
    ax.set_xscale("log")
    ax.set_xlabel("requests served (log scale)")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_title(f"{run['policy']}: resident memory")
    ax.legend(loc="lower right", bbox_to_anchor=(1, 0.15))  # between the flat curves
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", choices=sorted(HOSTS))
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--policy", default="canopy")
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--prefixes", type=int,
                        help=f"shared prefixes (default {PREFIXES_PER_BLOCK} a block of capacity)")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON here too")
    parser.add_argument("--plot", nargs="+", metavar=("PNG", "JSON"),
                        help="draw earlier runs' curves: the PNG, then their JSON files")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot[1:], args.plot[0])
        return
    if args.host is None:
        parser.error("--host is required")
    def write(report: dict) -> None:
        Path(args.out).write_text(json.dumps(report) + "\n")

    result = soak(args.host, args.requests, policy=args.policy, capacity=args.capacity,
                  prefixes=args.prefixes, samples=args.samples, seed=args.seed,
                  progress=write if args.out else None)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
