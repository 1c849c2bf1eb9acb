"""Runs inside vLLM's interpreter (tests/test_cache_vllm_pool.py): vLLM's own
``KVCacheManager`` serves a workload of prompts one at a time, as its scheduler would
(look the prefix up, allocate, cache, free), with Canopy's plugin installed for
``argv[1]`` (``vllm``: not installed; ``env``: the entry point, reading
``CANOPY_VLLM_EVICTION``). Prints JSON: per request the cached tokens vLLM
found and the block ids it was given, and the fail-safe's fallbacks (counted and logged)."""

from __future__ import annotations

import json
import logging
import sys


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1


def serve(policy: str, prompts: list[list[int]], blocks: int, block_size: int) -> dict:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    if policy == "env":  # the entry point as vLLM calls it: CANOPY_VLLM_EVICTION decides
        from canopy.integrations.vllm import register

        register()
    elif policy != "vllm":
        from canopy.integrations.vllm import install

        install(policy)
    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    longest = max(len(p) for p in prompts) + block_size
    manager = KVCacheManager(config, max_model_len=longest, scheduler_block_size=block_size,
                             hash_block_size=block_size, enable_caching=True)
    hasher = get_request_block_hasher(block_size, sha256)
    logged = _Count()
    logging.getLogger("canopy.prefix.failsafe").addHandler(logged)
    cached, given = [], []
    for i, prompt in enumerate(prompts):
        request = Request(str(i), prompt, SamplingParams(max_tokens=1), None,
                          block_hasher=hasher)
        computed, hit, _ = manager.get_computed_blocks(request)
        new = manager.allocate_slots(request, len(prompt) - hit, hit, computed)
        assert new is not None, "the pool cannot hold one request"
        request.num_computed_tokens = len(prompt)
        manager.cache_blocks(request, len(prompt))
        given.append(list(manager.get_block_ids(request.request_id)[0]))
        cached.append(hit)
        manager.free(request)
    failsafe = sys.modules.get("canopy.prefix.failsafe")  # loaded with a policy
    counted = 0 if failsafe is None else sum(failsafe.fallbacks().values())
    return {"cached_tokens": cached, "block_ids": given, "fallbacks": counted,
            "fallbacks_logged": logged.records}


if __name__ == "__main__":
    job = json.loads(sys.stdin.read())
    print(json.dumps(serve(sys.argv[1], job["prompts"], job["blocks"], job["block_size"])))
