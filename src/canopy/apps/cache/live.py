"""Live prefix caching on a real engine: workloads, time to first token, calibration.

``canopy cache live`` sends a shared-prefix request stream to the llama.cpp server of
:mod:`canopy.engines.llama_server` once per policy (a fresh server each, so every policy starts
cold) and measures, per request, the time to the first streamed token (TTFT, from sending the
request to the first completion chunk). Prompts are made of words the model's tokenizer maps
to one token each (``" word"``), so text prefixes are token prefixes and a block of
``block_tokens`` words is a block of the engine.

Workloads: :mod:`canopy.engines.workloads` (Zipf few-shot prefixes, or a Mooncake trace's
prefix structure made into words).

Calibration (:func:`calibrate`): the least-squares fit of the replay's TTFT model
(:class:`~canopy.prefix.ttft.TTFTModel`: fixed cost plus cost per uncached token) to every
measured request, the uncached tokens being the prompt minus the blocks the server's policy
reused. The replay (:func:`predicted_reuse` on the same block chains) then predicts each
policy's TTFT saved over caching off.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from canopy._lazy import deprecated_aliases
from canopy.engines.workloads import Workload
from canopy.prefix import RadixCache
from canopy.prefix.failsafe import FailSafeCache
from canopy.prefix.policies import make_policy
from canopy.prefix.stream import StreamingCache
from canopy.prefix.traces import from_paths, full_blocks
from canopy.prefix.ttft import TTFTModel, load_calibration

__all__ = ["LiveRun", "block_chains", "calibrate", "load_calibration", "predicted_reuse",
           "run_live", "run_live_vllm", "summarize", "token_prompts"]


@dataclass
class LiveRun:
    """One policy's pass over a workload: per-request TTFT and total time (seconds), and the
    server cache's per-request reused and prompt blocks and prompt tokens."""

    policy: str
    start: int = 0
    ttft_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    server: dict[str, Any] = field(default_factory=dict)


def _stream_one(client: Any, model: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    """TTFT and total time of one streamed completion."""
    began = time.perf_counter()
    first = math.nan
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True}
    with client.stream("POST", "/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]") and (
                    math.isnan(first)):
                if json.loads(line[5:]).get("choices"):
                    first = time.perf_counter() - began
    if math.isnan(first):
        raise RuntimeError("the server streamed no completion chunk")
    return first, time.perf_counter() - began


def run_policy(policy: str, workload: Workload, *, capacity_mb: float, block_tokens: int,
               n_threads: int, max_tokens: int, model_path: Path, n_ctx: int,
               plan: Path | None = None,
               progress: Callable[[int], None] | None = None) -> LiveRun:
    """Start the engine with ``policy`` (``off`` for no caching; ``plan``, the workload's
    token ids, for a policy that reads the future), send every prompt in order, return the
    timings and the server cache's statistics."""
    import httpx

    from canopy.llm.local import LocalLlamaServer

    key = secrets.token_urlsafe(24)
    args = ["--policy", policy, "--capacity-mb", repr(capacity_mb), "--block-tokens",
            str(block_tokens), *(() if plan is None else ("--plan", str(plan)))]
    run = LiveRun(policy, workload.start)
    with LocalLlamaServer(model_path, n_ctx=n_ctx, n_threads=n_threads, extra_args=args,
                          module="canopy.engines.llama_server", api_key=key) as server, \
            httpx.Client(base_url=server.direct_url, timeout=600.0,
                         headers={"Authorization": f"Bearer {key}"}) as client:
        _stream_one(client, server.model, " hello", 1)  # warm-up: shorter than a block
        began = time.perf_counter()
        for i in range(len(workload.prompts)):
            if i == workload.start:
                began = time.perf_counter()
            ttft, total = _stream_one(client, server.model, workload.text(i), max_tokens)
            run.ttft_s.append(ttft)
            run.total_s.append(total)
            if progress is not None:
                progress(1)
        run.wall_s = time.perf_counter() - began
        answer = client.get(server.direct_url.removesuffix("/v1") + "/canopy/cache")
        answer.raise_for_status()
        run.server = answer.json()
    run.server = {**run.server, **{k: run.server[k][1:] for k in (
        "reused_blocks", "prompt_blocks", "prompt_tokens")}}  # drop the warm-up
    return run


def _stream_vllm(client: Any, model: str, prompt: list[int], max_tokens: int
                 ) -> tuple[float, float, int]:
    """TTFT, total time and the cached prompt tokens vLLM reports for one streamed
    completion of token ids."""
    began = time.perf_counter()
    first, cached = math.nan, -1
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() in ("", "[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and math.isnan(first):
                first = time.perf_counter() - began
            if chunk.get("usage"):
                details = chunk["usage"].get("prompt_tokens_details") or {}
                cached = int(details.get("cached_tokens") or 0)
    if math.isnan(first) or cached < 0:
        raise RuntimeError("vLLM streamed no completion chunk or no usage")
    return first, time.perf_counter() - began, cached


def run_vllm_policies(policies: Sequence[str], workloads: Sequence[Workload], *,
                      blocks: int, block_tokens: int, n_threads: int, max_tokens: int,
                      folder: Path, dummy: bool, vocab: Any,
                      progress: Callable[[int], None] | None = None
                      ) -> dict[str, list[LiveRun]]:
    """:func:`run_policy` on vLLM (:class:`~canopy.engines.vllm_server.VLLMServer`): one
    server a policy, all up at once, every prompt sent to each server in turn (the order
    rotating by request), so that the policies meet the same machine load request for request
    and a time-to-first-token difference is the cache's, not the load's; the workloads one
    after the other (their words differ, so no block is shared between them); prompts as
    token ids; each request's reuse from the cached tokens vLLM reports; the hit rate of the
    counted requests from vLLM's own prefix-cache counters. A run's ``wall_s`` is the time
    its own requests took."""
    from contextlib import ExitStack

    import httpx

    from canopy.engines.vllm_server import VLLMServer

    prompts = [token_prompts(w, vocab) for w in workloads]
    longest = max(len(p) for per in prompts for p in per) + max_tokens + block_tokens
    runs: dict[str, list[LiveRun]] = {policy: [] for policy in policies}
    with ExitStack() as stack:
        servers, clients = {}, {}
        for policy in policies:
            server = stack.enter_context(VLLMServer(
                folder, policy=policy, blocks=blocks, block_tokens=block_tokens,
                max_model_len=longest, threads=n_threads, dummy=dummy))
            servers[policy], clients[policy] = server, stack.enter_context(httpx.Client(
                base_url=f"{server.url}/v1", timeout=600.0, headers=server.headers))
            _stream_vllm(clients[policy], server.model, [1, 2, 3], 1)  # shorter than a block
        for workload, sent in zip(workloads, prompts, strict=True):
            current = {policy: LiveRun(policy, workload.start) for policy in policies}
            reused: dict[str, list[int]] = {policy: [] for policy in policies}
            before, failed = {}, {policy: servers[policy].fallbacks() for policy in policies}
            for i, prompt in enumerate(sent):
                if i == workload.start:  # the counted requests start here
                    before = {policy: servers[policy].metrics() for policy in policies}
                for k in range(len(policies)):
                    policy = policies[(i + k) % len(policies)]
                    ttft, total, cached = _stream_vllm(clients[policy], servers[policy].model,
                                                       prompt, max_tokens)
                    current[policy].ttft_s.append(ttft)
                    current[policy].total_s.append(total)
                    reused[policy].append(cached // block_tokens)
                    if progress is not None:
                        progress(1)
            for policy, run in current.items():
                after = servers[policy].metrics()
                queries, hits = (after.get(f"vllm:prefix_cache_{name}_total", 0.0)
                                 - before[policy].get(f"vllm:prefix_cache_{name}_total", 0.0)
                                 for name in ("queries", "hits"))
                run.wall_s = float(sum(run.total_s[workload.start:]))
                run.server = {"policy": policy, "capacity_blocks": replay_capacity(blocks),
                              "pool_blocks": blocks, "block_tokens": block_tokens,
                              "reused_blocks": reused[policy],
                              "prompt_blocks": [len(p) // block_tokens for p in sent],
                              "prompt_tokens": [len(p) for p in sent], "unbacked": 0,
                              "state_bytes": 0,
                              "fallbacks": servers[policy].fallbacks() - failed[policy],
                              "prefix_cache_hit_rate": hits / queries if queries else 0.0}
                runs[policy].append(run)
    return runs


def run_live_vllm(policies: Sequence[str], workload_of: Callable[[int], Workload], *,
                  repeats: int = 1, seed: int = 0, blocks: int = 24, block_tokens: int = 32,
                  n_threads: int = 1, max_tokens: int = 4, folder: Path, weights: str,
                  vocab: Any, calibration: TTFTModel | None = None,
                  progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """:func:`run_live` on vLLM: every policy (``off``, ``vllm`` for vLLM's own eviction,
    or a plugin policy) on ``repeats`` workloads, with the replay of the same token blocks
    (a prefix-hash chain per prompt, the workloads one after the other as the server saw
    them) at the blocks vLLM can cache (:func:`replay_capacity`)."""
    workloads = [workload_of(seed + r) for r in range(repeats)]
    runs = run_vllm_policies(
        policies, workloads, blocks=blocks, block_tokens=block_tokens, n_threads=n_threads,
        max_tokens=max_tokens, folder=folder, dummy=weights == "dummy", vocab=vocab,
        progress=progress)
    fitted, r2 = calibrate([run for per in runs.values() for run in per])
    model = fitted if calibration is None else calibration
    capacity = replay_capacity(blocks)
    chains = [full_blocks(p, block_tokens) for w in workloads for p in token_prompts(w, vocab)]
    out: dict[str, Any] = {
        "engine": "vllm", "model": {"name": "SmolLM2-135M", "weights": weights},
        "workload": workloads[0].name, "capacity_blocks": capacity, "pool_blocks": blocks,
        "block_tokens": block_tokens, "repeats": repeats,
        "requests_per_run": len(workloads[0].prompts), "counted_from": workloads[0].start,
        "calibration": _calibration_json(model, fitted, r2, given=calibration is not None),
        "results": {}}
    cuts = np.cumsum([0] + [len(w.prompts) for w in workloads])
    for policy, per in runs.items():
        name = "lru" if policy == "vllm" else policy
        whole = predicted_reuse(chains, name, capacity)
        predicted = [whole[a:b] for a, b in itertools.pairwise(cuts)]
        entry = summarize(per, predicted, runs.get("off"), model,
                          None if policy == "off" else runs.get("vllm"))
        entry["prefix_cache_hit_rate"] = float(np.mean([
            r.server["prefix_cache_hit_rate"] for r in per]))
        out["results"][policy] = entry
    return out


def replay_capacity(pool_blocks: int) -> int:
    """Cached blocks vLLM holds between requests with a pool of ``pool_blocks``: one is its
    null block and one the running request's partial last block (prompts end mid-block)."""
    return pool_blocks - 2


def token_prompts(workload: Workload, vocab: Any) -> list[list[int]]:
    """The workload's prompts as token ids, no BOS (what is sent to vLLM); every prompt
    ends mid-block (the questions' length is no multiple of a block)."""
    return [vocab.tokenize(workload.text(i).encode(), add_bos=False, special=True)
            for i in range(len(workload.prompts))]


def calibrate(runs: Sequence[LiveRun]) -> tuple[TTFTModel, float]:
    """Least-squares ``ttft = overhead + per_token * uncached_tokens`` over every request of
    ``runs`` (milliseconds); returns the model and the fit's R^2."""
    uncached, ttft = [], []
    for run in runs:
        tokens = np.asarray(run.server["prompt_tokens"], dtype=float)
        reused = np.asarray(run.server["reused_blocks"], dtype=float) * run.server[
            "block_tokens"]
        uncached.append(tokens - reused)
        ttft.append(np.asarray(run.ttft_s) * 1000.0)
    x, y = np.concatenate(uncached), np.concatenate(ttft)
    if np.ptp(x) == 0:
        raise ValueError("every request prefilled the same number of tokens; calibration "
                         "needs runs with caching (pass a policy besides off)")
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1.0 - np.sum((y - (intercept + slope * x)) ** 2) / np.sum((y - y.mean()) ** 2)
    return TTFTModel(ms_per_token=max(float(slope), 0.0),
                     overhead_ms=max(float(intercept), 0.0)), float(r2)


def _calibration_json(model: TTFTModel, fitted: TTFTModel, r2: float, *,
                      given: bool) -> dict[str, Any]:
    """The JSON ``calibration`` entry: the model the prediction used and the fit beside it."""
    return {"ms_per_token": model.ms_per_token, "overhead_ms": model.overhead_ms,
            "source": "given" if given else "fitted on these runs", "fitted_r2": r2,
            "fitted_ms_per_token": fitted.ms_per_token, "fitted_overhead_ms": fitted.overhead_ms}


def block_chains(workload: Workload, vocab: Any, block_tokens: int
                 ) -> list[list[tuple[int, ...]]]:
    """Each prompt's full blocks, tokenized as the engine tokenizes it (BOS included)."""
    return [full_blocks(vocab.tokenize(workload.text(i).encode(), add_bos=True,
                                       special=True), block_tokens)
            for i in range(len(workload.prompts))]


def predicted_reuse(chains: Sequence[Sequence[tuple[int, ...]]], policy: str,
                    capacity_blocks: int) -> np.ndarray:
    """Blocks each request reuses in the replay of the block chains (0 for ``off``). An online
    policy replays fail-safe, as its hosts run it
    (:class:`~canopy.prefix.failsafe.FailSafeCache`): should it raise, LRU predicts the rest
    and the run still reports."""
    if policy == "off":
        return np.zeros(len(chains), dtype=np.int64)
    if make_policy(policy).offline:
        return RadixCache(from_paths(chains), make_policy(policy), capacity_blocks).run()
    cache = FailSafeCache(StreamingCache(policy, capacity_blocks))
    return np.fromiter((cache.request(keys) for keys in chains), dtype=np.int64,
                       count=len(chains))


def _write_plan(workload: Workload, vocab: Any, folder: Path) -> Path:
    """The workload's token ids, one JSON list a line (the engine's ``--plan``)."""
    file = folder / f"plan-{id(workload)}.jsonl"
    file.write_text("".join(json.dumps(vocab.tokenize(workload.text(i).encode(), add_bos=True,
                                                      special=True)) + "\n"
                            for i in range(len(workload.prompts))))
    return file


def run_live(policies: Sequence[str], workload_of: Callable[[int], Workload], *,
             repeats: int = 1, seed: int = 0, capacity_mb: float = 6.0,
             block_tokens: int = 16, n_threads: int = 2, max_tokens: int = 4,
             n_ctx: int = 512, model_path: Path, vocab: Any,
             calibration: TTFTModel | None = None,
             progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Every policy on ``repeats`` workloads (seeds ``seed``, ``seed + 1``, ...): per-policy
    summaries, the calibration fitted on these runs (or the one given) and the replay's
    prediction of TTFT saved, and whether the replay's reuse matched the server's."""
    import tempfile

    runs: dict[str, list[LiveRun]] = {p: [] for p in policies}
    workloads = []
    with tempfile.TemporaryDirectory(prefix="canopy-plan-") as folder:
        for r in range(repeats):
            workload = workload_of(seed + r)
            workloads.append(workload)
            for policy in policies:
                offline = policy != "off" and make_policy(policy).offline
                plan = _write_plan(workload, vocab, Path(folder)) if offline else None
                runs[policy].append(run_policy(
                    policy, workload, capacity_mb=capacity_mb, block_tokens=block_tokens,
                    n_threads=n_threads, max_tokens=max_tokens, model_path=model_path,
                    n_ctx=n_ctx, plan=plan, progress=progress))
    fitted, r2 = calibrate([run for per in runs.values() for run in per])
    model = fitted if calibration is None else calibration
    capacity_blocks = next(iter(runs.values()))[0].server["capacity_blocks"]
    out: dict[str, Any] = {
        "workload": workloads[0].name, "capacity_mb": capacity_mb,
        "capacity_blocks": capacity_blocks, "block_tokens": block_tokens, "repeats": repeats,
        "requests_per_run": len(workloads[0].prompts), "counted_from": workloads[0].start,
        "calibration": _calibration_json(model, fitted, r2, given=calibration is not None),
        "results": {}}
    chains = [block_chains(w, vocab, block_tokens) for w in workloads]
    for policy, per in runs.items():
        predicted = [predicted_reuse(c, policy, capacity_blocks) for c in chains]
        out["results"][policy] = summarize(per, predicted, runs.get("off"), model,
                                           None if policy == "off" else runs.get("lru"))
    return out


def summarize(runs: Sequence[LiveRun], predicted: Sequence[np.ndarray],
              off: Sequence[LiveRun] | None, model: TTFTModel,
              lru: Sequence[LiveRun] | None = None) -> dict[str, Any]:
    """One policy's headline numbers over its repeats (counted requests only); with ``lru``
    (the LRU control's runs on the same workloads), ``ttft_vs_lru_s``: the time to first
    token gained over LRU, paired by request (the same prompt at the same position): its mean
    with a 95% interval over the counted requests (given these workloads) and over the
    repeats' means (across workloads)."""
    from canopy.stats import t_interval

    def counted(run: LiveRun, values: Sequence[float]) -> np.ndarray:
        return np.asarray(values, dtype=float)[run.start:]

    ttft = np.concatenate([counted(r, r.ttft_s) for r in runs])
    reused = np.concatenate([counted(r, r.server["reused_blocks"]) for r in runs])
    blocks = np.concatenate([counted(r, r.server["prompt_blocks"]) for r in runs])
    block_tokens = runs[0].server["block_tokens"]
    matched = all(np.array_equal(counted(r, r.server["reused_blocks"]), counted(r, p))
                  for r, p in zip(runs, predicted, strict=True))
    entry: dict[str, Any] = {
        "ttft_p50_s": float(np.median(ttft)), "ttft_p90_s": float(np.quantile(ttft, 0.9)),
        "ttft_mean_s": float(ttft.mean()),
        "latency_mean_s": float(np.concatenate([counted(r, r.total_s) for r in runs]).mean()),
        "hit_rate": float(reused.sum() / max(blocks.sum(), 1)),
        "requests": len(ttft),
        "throughput_rps": float(sum(len(counted(r, r.ttft_s)) for r in runs) / sum(
            r.wall_s for r in runs)),
        "replay_matches_server": bool(matched),
        "predicted_ttft_saved_s": float(np.mean([
            model.saved_ms(counted(r, p) * block_tokens).mean() / 1000.0
            for r, p in zip(runs, predicted, strict=True)])),
        "state_bytes": int(np.mean([r.server["state_bytes"] for r in runs])),
        "unbacked": int(sum(r.server["unbacked"] for r in runs)),
        "fallbacks": int(sum(r.server.get("fallbacks", 0) for r in runs)),
    }
    if off is not None:
        saved = [counted(o, o.ttft_s).mean() - counted(r, r.ttft_s).mean()
                 for o, r in zip(off, runs, strict=True)]
        mean, low, high = t_interval(saved)
        paired = np.concatenate([counted(o, o.ttft_s) - counted(r, r.ttft_s)
                                 for o, r in zip(off, runs, strict=True)])
        entry["ttft_saved_s"] = {"mean": mean, "ci95": None if low is None else [low, high],
                                 "per_repeat": [float(s) for s in saved],
                                 "median": float(np.median(paired))}
        entry["predicted_ttft_saved_median_s"] = float(np.median(np.concatenate([
            model.saved_ms(counted(r, p) * block_tokens) / 1000.0
            for r, p in zip(runs, predicted, strict=True)])))
    if lru is not None and lru is not runs:
        gained = [counted(b, b.ttft_s) - counted(r, r.ttft_s)
                  for b, r in zip(lru, runs, strict=True)]
        mean, low, high = t_interval(np.concatenate(gained))
        per_repeat = [float(g.mean()) for g in gained]
        _, repeat_low, repeat_high = t_interval(per_repeat)
        entry["ttft_vs_lru_s"] = {
            "mean": mean, "ci95": None if low is None else [low, high],
            "per_repeat": per_repeat,
            "ci95_repeats": None if repeat_low is None else [repeat_low, repeat_high]}
    return entry


deprecated_aliases(__name__, {name: "canopy.engines.workloads" for name in (
    "mooncake_workload", "word_vocabulary", "zipf_workload")})
