"""Canopy's eviction inside a real inference engine: llama.cpp through llama-cpp-python.

llama-cpp-python looks a prompt up in a replaceable cache (``Llama.set_cache``) before it
prefills: the cache returns a saved engine state (the KV cache of some token sequence) and the
engine reuses the state's longest common prefix with the prompt, prefilling only the rest;
after the completion it offers the state of prompt plus completion to the cache. Its built-in
``LlamaRAMCache`` is LRU over whole states. :class:`PolicyStateCache` puts any online policy of
:mod:`canopy.prefix` in charge instead, with the policy code itself
(:class:`~canopy.prefix.stream.StreamingCache`, the replay's kernels):

* **Blocks.** A prompt is a chain of ``block_tokens``-token blocks (the trailing partial
  block is not cacheable, as in vLLM); the policy sees the chain, reuses its longest cached
  prefix, inserts the rest and evicts leaves, under a capacity of ``capacity_bytes`` of KV
  memory: ``capacity_bytes // (block_tokens * kv_bytes_per_token)`` blocks, the memory a paged
  engine (vLLM, SGLang) holds for them.
* **States.** llama.cpp's states are whole-prefix snapshots, not pages. The cache keeps one
  snapshot per cached chain end (anchored at the deepest cached block of the request that
  saved it; cut back when the policy evicts below it, dropped when nothing of it is cached),
  and serves a hit of ``r`` blocks from a snapshot covering them, *capped at ``r *
  block_tokens`` tokens*, so the engine reuses exactly what the policy cached, no more. The
  snapshots' real bytes (:attr:`PolicyStateCache.state_bytes`) exceed the paged accounting
  where chains share prefixes; both are reported.
* **No hidden cache.** llama.cpp also reuses the prefix its context still holds from the
  previous request (a one-slot cache no policy controls); :meth:`PolicyStateCache.bind` makes
  the engine clear its context at the start of every completion, so the policy is the only
  source of reuse. ``policy=None`` is caching off: lookups are counted and miss, and the
  engine is told not to save states (it checks ``if cache`` before saving).

:mod:`canopy.engines.llama_server` serves a model with this cache.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_cpp import BaseLlamaCache, Llama, LlamaState  # the ``engine`` extra

from canopy.prefix.failsafe import DEFAULT_MAX_NODES, FailSafeCache
from canopy.prefix.policies import EvictionPolicy, resolve_policy
from canopy.prefix.stream import PlannedCache, StreamingCache
from canopy.prefix.traces import full_blocks
from canopy.validation import check_count

__all__ = ["PolicyStateCache", "kv_bytes_per_token"]

F16_BYTES = 2
LOG_REQUESTS = 100_000
"""Requests whose reuse :meth:`PolicyStateCache.stats` reports (the latest ones)."""


def kv_bytes_per_token(llama: Llama) -> int:
    """KV-cache bytes one token occupies, from the model's GGUF metadata: ``2 (K and V) *
    layers * kv_heads * head_dim * 2`` (f16, llama.cpp's default cache type; ``head_dim`` the
    key length, else embedding / heads). SmolLM2-135M: 2 * 30 * 3 * 64 * 2 = 23,040. Works on
    a ``vocab_only`` model too."""
    meta = llama.metadata
    arch = meta["general.architecture"]
    heads = int(meta[f"{arch}.attention.head_count"])
    head_dim = int(meta.get(f"{arch}.attention.key_length",
                            int(meta[f"{arch}.embedding_length"]) // heads))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    return 2 * int(meta[f"{arch}.block_count"]) * kv_heads * head_dim * F16_BYTES


class PolicyStateCache(BaseLlamaCache):
    """A llama-cpp-python prompt cache whose evictions follow a Canopy policy (see the module
    docstring). ``policy`` is a policy name, a user's ``package.module:ClassName`` or a policy
    object (:func:`~canopy.prefix.policies.resolve_policy`), or ``None`` for caching off;
    bind the engine with :meth:`bind` before use. An online policy is fail-safe
    (:class:`~canopy.prefix.failsafe.FailSafeCache`): should it raise, or its tables outgrow
    ``max_nodes`` nodes, LRU serves from then on, and :meth:`stats` counts the fallback."""

    def __init__(self, policy: EvictionPolicy | type[EvictionPolicy] | str | None,
                 capacity_bytes: int, *,
                 block_tokens: int = 16, kv_bytes: int, history_floor: float | None = 0.5,
                 plan: Sequence[Sequence[int]] | None = None,
                 max_nodes: int = DEFAULT_MAX_NODES) -> None:
        for name, value in (("capacity_bytes", capacity_bytes), ("block_tokens", block_tokens),
                            ("kv_bytes", kv_bytes)):
            check_count(value, name)
        super().__init__(capacity_bytes)
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_bytes // (block_tokens * kv_bytes)
        if policy is not None and self.capacity_blocks < 1:
            raise ValueError(f"capacity_bytes {capacity_bytes} holds no block of "
                             f"{block_tokens} tokens ({block_tokens * kv_bytes} bytes)")
        if policy is None:
            self.policy_cache = None
        elif plan is None:
            self.policy_cache = FailSafeCache(StreamingCache(
                resolve_policy(policy, online=True), self.capacity_blocks,
                history_floor=history_floor), max_nodes=max_nodes)
        else:  # the prompts to come are known: any policy, the offline optimum included
            self.policy_cache = PlannedCache(
                resolve_policy(policy), self.capacity_blocks,
                [self._blocks(tuple(p)) for p in plan])
        # per-request log for measurement, bounded for a long-running server
        self.reused: deque[int] = deque(maxlen=LOG_REQUESTS)
        self.prompt_blocks: deque[int] = deque(maxlen=LOG_REQUESTS)
        self.prompt_tokens: deque[int] = deque(maxlen=LOG_REQUESTS)
        self.requests = 0
        self.unbacked = 0
        self._states: dict[tuple[int, ...], LlamaState] = {}
        self._lookup_open = False

    def bind(self, llama: Llama) -> PolicyStateCache:
        """Install in ``llama`` and make each of its completions start from an empty context
        (``Llama.__call__`` calls ``self.create_completion``, wrapped here)."""
        complete = llama.create_completion

        def create_completion(*args: Any, **kwargs: Any) -> Any:
            llama.reset()
            self._lookup_open = True
            return complete(*args, **kwargs)

        llama.create_completion = create_completion
        llama.set_cache(self)
        return self

    # ------------------------------------------------------------ the engine's interface
    def __bool__(self) -> bool:
        """The engine checks ``if cache`` before its lookup and again before saving a state;
        caching off takes the lookup (to count it) and declines the save."""
        return self.policy_cache is not None or self._lookup_open

    @property
    def cache_size(self) -> int:
        return self.state_bytes

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        tokens = tuple(key)
        blocks = self._blocks(tokens)
        self.prompt_blocks.append(len(blocks))
        self.prompt_tokens.append(len(tokens))
        self.requests += 1
        self._lookup_open = False
        if self.policy_cache is None:
            self.reused.append(0)
            raise KeyError("caching is off")
        reused = self.policy_cache.request(blocks)
        self.reused.append(reused)
        self._prune()
        if reused == 0:
            raise KeyError("no cached prefix")
        prefix = tokens[:reused * self.block_tokens]
        state = next((s for anchor, s in self._states.items()
                      if anchor[:len(prefix)] == prefix), None)
        if state is None:  # blocks inserted by a request that never finished
            self.unbacked += 1
            raise KeyError("cached blocks without a saved state")
        return LlamaState(input_ids=state.input_ids, scores=state.scores,
                          n_tokens=len(prefix), llama_state=state.llama_state,
                          llama_state_size=state.llama_state_size, seed=state.seed)

    def __contains__(self, key: Sequence[int]) -> bool:
        return self.policy_cache is not None and self.policy_cache.cached_prefix(
            self._blocks(tuple(key))) > 0

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        if self.policy_cache is None:
            return
        tokens = tuple(key)
        cached = self.policy_cache.cached_prefix(self._blocks(tokens))
        if cached == 0:
            return
        anchor = tokens[:cached * self.block_tokens]
        for other in [a for a in self._states if anchor[:len(a)] == a]:
            del self._states[other]  # a shorter chain this one covers
        # the engine re-evaluates at least one token after a load, so the logits are dead
        # weight (n_batch x vocabulary floats); keep one row for the engine's copy
        self._states[anchor] = LlamaState(
            input_ids=value.input_ids, scores=np.zeros((1, value.scores.shape[1]),
                                                       dtype=value.scores.dtype),
            n_tokens=value.n_tokens, llama_state=value.llama_state,
            llama_state_size=value.llama_state_size, seed=value.seed)

    # ------------------------------------------------------------ bookkeeping
    @property
    def state_bytes(self) -> int:
        """Bytes of the engine snapshots held now."""
        return sum(s.llama_state_size for s in self._states.values())

    def stats(self) -> dict[str, Any]:
        """Counts so far and each request's reused and prompt blocks (in request order)."""
        return {"policy": None if self.policy_cache is None else
                getattr(self.policy_cache, "name", self.policy_cache.policy.name),
                "capacity_blocks": self.capacity_blocks, "block_tokens": self.block_tokens,
                "requests": self.requests, "reused_blocks": list(self.reused),
                "prompt_blocks": list(self.prompt_blocks),
                "prompt_tokens": list(self.prompt_tokens), "unbacked": self.unbacked,
                "states": len(self._states), "state_bytes": self.state_bytes,
                "cached_blocks": 0 if self.policy_cache is None else self.policy_cache.size,
                "fallbacks": getattr(self.policy_cache, "fallbacks", 0),
                "fallback_reason": getattr(self.policy_cache, "reason", None)}

    def _blocks(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        return full_blocks(tokens, self.block_tokens)

    def _prune(self) -> None:
        """Cut each snapshot back to the part of its chain still cached; drop the rest."""
        for anchor in list(self._states):
            cached = self.policy_cache.cached_prefix(self._blocks(anchor))
            kept = anchor[:cached * self.block_tokens]
            if len(kept) == len(anchor):
                continue
            state = self._states.pop(anchor)
            if kept and kept not in self._states and not any(
                    a[:len(kept)] == kept for a in self._states):
                self._states[kept] = state
