"""``canopy fleet bench``: replica routers side by side in front of live engines on loopback.

Each router fronts its own ``N`` engine replicas, started identically (the same model, KV
pool and flags), so that one router's requests never warm or evict another's cache and each
router's hit rate comes from its own engines' counters. All replicas and routers are up at
once and the request stream is interleaved as ``canopy cache live`` interleaves its policies:
request ``i`` is released to every router in turn (the order rotating with ``i``), each router
keeping at most ``concurrency`` requests in flight, so the routers meet the same machine load
request for request and a difference in time to first token (TTFT) is the routing's.

Routers (:data:`ROUTERS`): ``sglang-router`` and ``vllm-router``, the registry packages' own
binaries with their default cache-aware policy (they try to download a tokenizer, fail
offline and go on); ``round-robin`` and ``least-load``, chosen by the client over the
replicas (references without a router process).

The stream (the workloads of ``canopy cache live``: Zipf few-shot prefixes or a Mooncake
trace's prefix structure, one token a word) is also written in Mooncake format
(:func:`write_mooncake`: one hash id a block, 512 tokens a block as in the mirrored traces)
and replayed by the fleet simulator (:func:`predict`), whose figures are printed beside the
live ones.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from canopy.errors import EngineError
from canopy.stats import mean_ci
from canopy.validation import check_count

__all__ = ["ENGINES", "PEERS", "ROUTERS", "BenchError", "Front", "MissingPeer", "Outcome",
           "Replica", "RouterRuns", "bench_json", "calibrate", "canopy_gateway", "fit_ttft",
           "gateway_config", "gateway_predictions", "interleave", "peer_binary",
           "peer_router", "predict", "publishes_events", "ranking", "run_bench", "send",
           "start_replicas", "write_mooncake"]

ENGINES = ("vllm", "llama")
SIM_ENGINE = {"vllm": "batched", "llama": "serial"}
"""How each engine prefills, in the simulator's terms (:data:`canopy.apps.fleet.sim.ENGINES`):
vLLM batches the requests a replica holds; the llama.cpp engine serves one at a time."""
PEERS = ("sglang-router", "vllm-router")
CLIENT_SIDE = ("round-robin", "least-load")
ROUTERS = ("canopy", *PEERS, *CLIENT_SIDE)
"""Router names of ``--peers`` and of the JSON's ``results``."""
INSTALL = "pip install sglang-router==0.3.2 vllm-router==0.1.17"
SIM_POLICY = {"canopy": "canopy", "sglang-router": "sglang", "vllm-router": "sglang",
              "round-robin": "round_robin", "least-load": "least_load"}
"""The simulator's rule for each live router (vllm-router's ``cache_aware`` is SGLang's)."""


class BenchError(EngineError):
    """A replica or router could not be started or answered wrongly at start."""


class MissingPeer(BenchError, ValueError):
    """A peer router's binary is not installed (the message says how to install it)."""


def peer_binary(name: str) -> str:
    """The console script of peer router ``name``: next to this interpreter, else on PATH."""
    if name not in PEERS:
        raise ValueError(f"peer must be one of {', '.join(PEERS)}, got {name!r}")
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise MissingPeer(f"{name} is not installed: {INSTALL} (or pip install "
                          f"'canopy-bandits[peers]'), then put its bin folder on PATH")
    return found


@dataclass(frozen=True)
class Replica:
    """One engine replica: its API root (``http://host:port``), headers, served model, and
    ``counters()``: the engine's own cumulative (cache hits, cache lookups)."""

    url: str
    headers: dict[str, str]
    model: str
    counters: Callable[[], tuple[float, float]]
    events_endpoint: str | None = None
    tokenizer: str | None = None
    block_tokens: int = 16


@dataclass
class Front:
    """How requests reach one router's replicas: through ``url`` (a router process), or,
    without one, chosen by the client: ``least-load`` the replica with the fewest of this
    front's requests in flight (the first of the tied), else rotated by request index
    (``round-robin``)."""

    name: str
    replicas: tuple[Replica, ...]
    url: str | None = None
    predictions: Callable[[], dict[str, float]] | None = None
    in_flight: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, i: int) -> int:
        """The replica (index) request ``i`` goes to, counted in flight until
        :meth:`release`; -1 when a router process chooses."""
        if self.url is not None:
            return -1
        with self.lock:
            if len(self.in_flight) != len(self.replicas):
                self.in_flight = [0] * len(self.replicas)
            k = (self.in_flight.index(min(self.in_flight)) if self.name == "least-load"
                 else i % len(self.replicas))
            self.in_flight[k] += 1
        return k

    def release(self, k: int) -> None:
        """Request over on replica ``k`` (what :meth:`acquire` returned)."""
        if k >= 0:
            with self.lock:
                self.in_flight[k] -= 1

    def target(self, k: int) -> str:
        """The URL of the replica :meth:`acquire` chose (-1: the router's)."""
        return self.url if k < 0 and self.url is not None else self.replicas[k].url

    def counters(self) -> tuple[float, float]:
        pairs = [r.counters() for r in self.replicas]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    def predicted(self) -> dict[str, float]:
        """The router's counts of answers by how its prediction of their cached tokens
        compared with the engine's report (``{}``: it predicts none)."""
        return {} if self.predictions is None else self.predictions()


@dataclass
class Outcome:
    """One request through one router: TTFT and total time (s), the cached prompt tokens
    the engine reported (-1: not reported), and the error that lost it (``None``: served)."""

    ttft_s: float = math.nan
    total_s: float = math.nan
    cached_tokens: int = -1
    sent_s: float = math.nan
    error: str | None = None


def send(client: Any, url: str, model: str, prompt: str | list[int], max_tokens: int,
         headers: dict[str, str]) -> Outcome:
    """One streamed ``/v1/completions`` request: TTFT is the first chunk with a choice."""
    began = time.perf_counter()
    out = Outcome()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body,
                           headers=headers) as response:
            if response.status_code != 200:
                response.read()
                out.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return out
            for line in response.iter_lines():
                if not line.startswith("data:") or line[5:].strip() in ("", "[DONE]"):
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("choices") and math.isnan(out.ttft_s):
                    out.ttft_s = time.perf_counter() - began
                usage = chunk.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    out.cached_tokens = int(details["cached_tokens"])
    except Exception as error:  # any failure loses the request (counted)
        out.error = f"{type(error).__name__}: {error}"
        return out
    out.total_s = time.perf_counter() - began
    if math.isnan(out.ttft_s):
        out.error = "no completion chunk"
    return out


def interleave(fronts: Sequence[Front], prompts: Sequence[str | list[int]], *, model: str,
               concurrency: int, max_tokens: int, headers: dict[str, str],
               progress: Callable[[int], None] | None = None) -> dict[str, list[Outcome]]:
    """Send every prompt through every front: prompt ``i`` is released to the fronts in
    the order rotated by ``i``, each front holding at most ``concurrency`` requests in flight
    (the release waits for a free slot), so that every front sees the same stream at the
    same pace. Returns each front's outcomes in stream order (``sent_s``: seconds from the
    first release)."""
    import httpx

    check_count(concurrency, "concurrency")
    out = {f.name: [Outcome() for _ in prompts] for f in fronts}
    slots = {f.name: threading.Semaphore(concurrency) for f in fronts}
    limits = httpx.Limits(max_connections=concurrency * len(fronts) + 4)
    began = time.perf_counter()
    with httpx.Client(timeout=600.0, limits=limits) as client, \
            ThreadPoolExecutor(concurrency * len(fronts)) as pool:
        def one(front: Front, i: int, sent: float) -> None:
            k = front.acquire(i)
            try:
                outcome = send(client, front.target(k), model, prompts[i], max_tokens,
                               headers)
                outcome.sent_s = sent
                out[front.name][i] = outcome
            finally:
                front.release(k)
                slots[front.name].release()
                if progress is not None:
                    progress(1)

        for i in range(len(prompts)):
            for k in range(len(fronts)):
                front = fronts[(i + k) % len(fronts)]
                slots[front.name].acquire()
                pool.submit(one, front, i, time.perf_counter() - began)
    return out


def _free_port() -> int:
    from canopy.llm.local import free_port

    return free_port()


@contextmanager
def _router_process(name: str, command: Sequence[str], port: int, log: Path, *,
                    env: dict[str, str] | None = None, startup_timeout: float
                    ) -> Iterator[str]:
    """Router ``name`` run as ``command`` on 127.0.0.1:``port``, its output to ``log``,
    until its ``GET /health`` answers 200; yields its URL and ends it (terminate, then kill)
    on the way out. One that exits first, or does not answer within ``startup_timeout``
    seconds: :class:`BenchError`, quoting the end of its log."""
    from canopy.engines.processes import wait_until_answering

    with log.open("wb") as sink:
        process = subprocess.Popen(list(command), stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(process, f"{url}/health", name=name, timeout=startup_timeout,
                             error=BenchError, output_tail=lambda: _tail(str(log)))
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def peer_router(name: str, replicas: Sequence[Replica], *,
                startup_timeout: float = 120.0) -> Iterator[str]:
    """Peer router ``name`` on 127.0.0.1 in front of ``replicas`` with its cache-aware
    policy (its other settings at their defaults); yields its URL. Its output goes to a
    temporary log, quoted when it fails to start."""
    binary = peer_binary(name)
    port, metrics_port = _free_port(), _free_port()
    command = [binary, *(("launch",) if name == "sglang-router" else ()),
               "--host", "127.0.0.1", "--port", str(port),
               "--worker-urls", *(r.url for r in replicas), "--policy", "cache_aware",
               "--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "RUST_LOG": "warn"}
    with tempfile.TemporaryDirectory(prefix=f"canopy-bench-{name}-") as folder, \
            _router_process(name, command, port, Path(folder) / "router.log", env=env,
                            startup_timeout=startup_timeout) as url:
        yield url


def gateway_config(replicas: Sequence[Replica], *, precise: bool,
                   overhead_tokens: float | None = None) -> dict[str, Any]:
    """The configuration of ``canopy serve router`` with one model served by ``replicas``
    under the ``canopy`` replica policy: ``precise`` from the replicas' KV events, else
    ``approximate`` (its routing history, calibrated by the cached tokens engines report);
    ``overhead_tokens``: the engines' per-request TTFT overhead in prompt tokens
    (:func:`calibrate`; ``None``: the policy's default)."""
    first = replicas[0]
    entries: list[Any] = [
        {"url": f"{r.url}/v1", "events_endpoint": r.events_endpoint, "events_topic": "kv"}
        if precise else f"{r.url}/v1" for r in replicas]
    return {"store": "memory", "prices": {"version": "fleet-bench", "models": {
                first.model: {"input": 0.0, "output": 0.0}}},
            "upstreams": [{"model": first.model, "upstream_model": first.model,
                           "timeout_s": 600,
                           "replicas": entries, "replica_policy": "canopy",
                           "replica_options": {} if overhead_tokens is None else
                           {"overhead_tokens": overhead_tokens},
                           "index": {"mode": "precise" if precise else "approximate",
                                     "block_size": first.block_tokens,
                                     "tokenizer": first.tokenizer}}]}


def gateway_predictions(url: str) -> dict[str, float]:
    """The gateway's ``canopy_cache_predictions`` counters from its ``/metrics``: answers
    whose cached prompt tokens the engine reported, by how the index's prediction compared
    (``exact``, ``over``, ``under``)."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30.0).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("canopy_cache_predictions_total{"):
            labels, _, value = line.rpartition(" ")
            outcome = labels.partition('outcome="')[2].partition('"')[0]
            out[outcome] = out.get(outcome, 0.0) + float(value)
    return out


def publishes_events(replicas: Sequence[Replica]) -> bool:
    """Whether Canopy's gateway can keep a precise index of ``replicas``: each publishes its
    KV events and the served model's tokenizer is at hand (vLLM with the converted model),
    else it keeps an approximate one."""
    return all(r.events_endpoint and r.tokenizer for r in replicas)


@contextmanager
def canopy_gateway(replicas: Sequence[Replica], *, precise: bool,
                   overhead_tokens: float | None = None,
                   startup_timeout: float = 120.0) -> Iterator[str]:
    """Canopy's gateway (``canopy serve router``, no client key, loopback, one worker) in
    front of ``replicas`` (:func:`gateway_config`); yields its URL."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="canopy-bench-gateway-") as folder:
        config = Path(folder) / "gateway.json"
        config.write_text(json.dumps(gateway_config(replicas, precise=precise,
                                                          overhead_tokens=overhead_tokens)))
        command = [sys.executable, "-m", "canopy", "serve", "router", "--config", str(config),
                   "--host", "127.0.0.1", "--port", str(port), "--insecure-no-auth"]
        with _router_process("canopy serve router", command, port,
                             Path(folder) / "gateway.log",
                             startup_timeout=startup_timeout) as url:
            yield url


def _tail(file: str, n_chars: int = 600) -> str:
    return " ".join(Path(file).read_text(errors="replace")[-n_chars:].split())


def start_replicas(engine: str, n: int, stack: ExitStack, *, block_tokens: int,
                   blocks: int, capacity_mb: float, max_model_len: int, threads: int = 1
                   ) -> list[Replica]:
    """``n`` engine replicas on loopback, ended with ``stack``: vLLM's CPU build (prefix
    caching on, a pool of ``blocks`` blocks; counters ``vllm:prefix_cache_hits_total`` and
    ``_queries_total``, in tokens) or llama.cpp with an LRU state cache of ``capacity_mb``
    (:mod:`canopy.engines.llama_server`; counters: ``/canopy/cache``'s reused and full
    prompt blocks)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    check_count(n, "replicas")
    if engine == "vllm":
        return [_vllm_replica(stack, block_tokens=block_tokens, blocks=blocks,
                              max_model_len=max_model_len, threads=threads)
                for _ in range(n)]
    return [_llama_replica(stack, block_tokens=block_tokens, capacity_mb=capacity_mb,
                           n_ctx=max_model_len, threads=threads) for _ in range(n)]


def _vllm_replica(stack: ExitStack, *, block_tokens: int, **options: Any) -> Replica:
    """A vLLM replica publishing its KV events (ZMQ, topic ``kv``) to an endpoint on
    loopback where Canopy's gateway binds, without an API key: the peer routers hand every
    worker the client's one key, and each :class:`VLLMServer` draws its own (loopback only).
    Both through a launcher script in vLLM's interpreter's place (the server's command is
    :class:`VLLMServer`'s)."""
    import shlex

    from canopy.engines.vllm_server import VLLMServer, model_folder, vllm_python
    from canopy.llm.local import find_smollm2_gguf

    python = vllm_python()
    folder, how = model_folder(find_smollm2_gguf(), python)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": endpoint, "topic": "kv"})
    launcher = Path(stack.enter_context(tempfile.TemporaryDirectory(
        prefix="canopy-bench-vllm-"))) / "python"
    launcher.write_text(f"#!/bin/sh\nunset VLLM_API_KEY\nexec {shlex.quote(python)} \"$@\" "
                        f"--kv-events-config {shlex.quote(events)}\n")
    launcher.chmod(0o700)
    server = stack.enter_context(VLLMServer(folder, policy="vllm", dummy=how == "dummy",
                                            python=str(launcher), block_tokens=block_tokens,
                                            **options))

    def counters() -> tuple[float, float]:
        values = server.metrics()
        return (values.get("vllm:prefix_cache_hits_total", 0.0),
                values.get("vllm:prefix_cache_queries_total", 0.0))

    tokenizer = folder if (folder / "tokenizer.json").is_file() else None
    return Replica(server.url, {}, server.model, counters, endpoint,
                   None if tokenizer is None else str(tokenizer), block_tokens)


def _llama_replica(stack: ExitStack, *, block_tokens: int, capacity_mb: float, n_ctx: int,
                   threads: int) -> Replica:
    import httpx

    from canopy.llm.local import LocalLlamaServer

    # no key: the peer routers' health checks send none (loopback only)
    server = stack.enter_context(LocalLlamaServer(
        n_ctx=n_ctx, n_threads=threads, module="canopy.engines.llama_server",
        extra_args=["--policy", "lru", "--capacity-mb", repr(capacity_mb), "--block-tokens",
                    str(block_tokens), "--no-auth"]))
    root = server.direct_url.removesuffix("/v1")

    def counters() -> tuple[float, float]:
        stats = httpx.get(f"{root}/canopy/cache", timeout=30.0).json()
        return float(sum(stats["reused_blocks"])), float(sum(stats["prompt_blocks"]))

    from canopy.engines.vllm_server import CONVERTED, model_cache

    tokenizer = model_cache() / CONVERTED  # the same vocabulary, where converted
    return Replica(root, {}, server.model, counters, None,
                   str(tokenizer) if (tokenizer / "tokenizer.json").is_file() else None,
                   block_tokens)


def _interval(values: Sequence[float]) -> dict[str, float]:
    mean, half = mean_ci(np.asarray(values, dtype=float))
    return {"mean": float(mean), "lo": float(mean - half), "hi": float(mean + half)}


@dataclass
class RouterRuns:
    """One router's repeats: per repeat its outcomes, its engines' hit rate and the counts
    of its predictions of cached tokens (:meth:`Front.predicted`, over the repeat)."""

    outcomes: list[list[Outcome]] = field(default_factory=list)
    hit_rate: list[float] = field(default_factory=list)
    predicted: list[dict[str, float]] = field(default_factory=list)


def bench_json(runs: dict[str, RouterRuns],
               prompt_tokens: Sequence[Sequence[Sequence[int]]]) -> dict[str, Any]:
    """The ``results`` of ``--json``: per router, TTFT p50 and p90 (each ``{"mean", "lo",
    "hi"}`` over repeats, the 95% Student-t interval), the engines' hit rate (mean over
    repeats), the requests lost, and, where the engines report per-request cached tokens,
    the share of prompt tokens they reported cached (``reported_hit_rate``), and, for a router
    that predicts them (Canopy's gateway), how often its prediction of a request's cached
    tokens equalled the engine's report (``cached_prediction``: the share ``exact`` and the
    counts, over repeats); ``prompt_tokens``: per repeat, each request's prompt tokens."""
    out: dict[str, Any] = {}
    for name, per in runs.items():
        served = [[o for o in rep if o.error is None] for rep in per.outcomes]
        entry: dict[str, Any] = {
            f"ttft_p{q}_s": _interval([float(np.percentile([o.ttft_s for o in rep], q))
                                       if rep else math.nan for rep in served])
            for q in (50, 90)}
        entry["hit_rate"] = float(np.mean(per.hit_rate)) if per.hit_rate else math.nan
        entry["lost"] = int(sum(len(rep) - len(ok) for rep, ok in zip(
            per.outcomes, served, strict=True)))
        errors = Counter(o.error for rep in per.outcomes for o in rep if o.error is not None)
        if errors:
            entry["errors"] = dict(errors.most_common(3))
        reported = [(o.cached_tokens, len(tokens))
                    for rep, sent in zip(per.outcomes, prompt_tokens, strict=True)
                    for o, tokens in zip(rep, sent, strict=True)
                    if o.error is None and o.cached_tokens >= 0]
        if reported:
            entry["reported_hit_rate"] = sum(c for c, _ in reported) / max(
                sum(t for _, t in reported), 1)
        counts = Counter[str]()
        for repeat in per.predicted:
            counts.update({k: round(v) for k, v in repeat.items()})
        if sum(counts.values()):
            entry["cached_prediction"] = {
                "exact": counts["exact"] / sum(counts.values()), "requests": sum(
                    counts.values()), "over": counts["over"], "under": counts["under"]}
        out[name] = entry
    return out


def _block_ids(tokens: Sequence[int], block_tokens: int) -> list[int]:
    """Each full block's prefix hash (the chain up to it), as a 63-bit integer."""
    ids, state = [], hashlib.sha256()
    for i in range(len(tokens) // block_tokens):
        state.update(json.dumps(list(tokens[i * block_tokens:(i + 1) * block_tokens])).encode())
        ids.append(int.from_bytes(state.copy().digest()[:8], "big") >> 1)
    return ids


def write_mooncake(file: Path, prompt_tokens: Sequence[Sequence[int]],
                   sent_s: Sequence[float], *, block_tokens: int, output_tokens: int) -> Path:
    """The stream in Mooncake format: one JSON line a request with ``timestamp`` (ms from
    the first request), ``input_length`` and ``output_length`` in Mooncake tokens (512 a
    block, the mirrored traces' unit: lengths scaled by ``512 / block_tokens``) and
    ``hash_ids`` (one id a full block, equal where the whole prefix up to it is equal)."""
    from canopy.prefix.traces import MOONCAKE_BLOCK_TOKENS

    scale = MOONCAKE_BLOCK_TOKENS / block_tokens
    start = min(sent_s) if len(sent_s) else 0.0
    with Path(file).open("w") as out:
        for tokens, sent in zip(prompt_tokens, sent_s, strict=True):
            out.write(json.dumps({
                "timestamp": round((sent - start) * 1000.0, 3),
                "input_length": round(len(tokens) * scale),
                "output_length": round(output_tokens * scale),
                "hash_ids": _block_ids(tokens, block_tokens)}) + "\n")
    return Path(file)


def predict(file: Path, routers: Sequence[str], *, n_replicas: int, capacity_blocks: int,
            load: float, ms_per_token: float, overhead_ms: float, tpot_ms: float,
            block_tokens: int, precise: bool, seeds: int = 3, engine: str = "serial",
            cores: float | None = None) -> dict[str, Any]:
    """The fleet simulator on the written stream: per router its rule's TTFT p50/p90 and hit
    rate (``canopy`` on the precise index where the engine publishes KV events, else the
    approximate one), plus ``least_load`` when no router is ``least-load``. Times per live
    token are converted to the file's 512-token unit; ``engine`` and ``cores``: the
    replicas' prefill (:func:`~canopy.apps.fleet.sim.simulate`)."""
    from canopy.apps.fleet.sim import Spec, load_trace, simulate, summarize
    from canopy.prefix.traces import MOONCAKE_BLOCK_TOKENS

    trace = load_trace(file)
    per_token = ms_per_token * block_tokens / MOONCAKE_BLOCK_TOKENS
    rows: dict[str, Any] = {}
    names = [*routers, *(() if "least-load" in routers else ("least_load",))]
    for name in names:
        rule = SIM_POLICY.get(name, name)
        index = ("precise" if precise else "approximate") if rule == "canopy" else \
            {"sglang": "approximate"}.get(rule, "none")
        runs = [simulate(trace, Spec(rule, index), n_replicas=n_replicas,
                         capacity=max(capacity_blocks, trace.longest), load=load, seed=s,
                         ms_per_token=per_token, overhead_ms=overhead_ms,
                         tpot_ms=tpot_ms * block_tokens / MOONCAKE_BLOCK_TOKENS,
                         time_decisions=False, engine=engine, cores=cores)
                for s in range(seeds)]
        row = summarize(runs)
        rows[name] = {"policy": rule, "index": index, "ttft_p50_s": row["ttft_p50_s"],
                      "ttft_p90_s": row["ttft_p90_s"], "hit_rate": row["hit_rate"]}
    return {"load": load, "ms_per_token": ms_per_token, "overhead_ms": overhead_ms,
            "capacity_blocks": capacity_blocks, "engine": engine, "cores": cores,
            "seeds": seeds, "results": rows}


def _fit(pairs: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``ttft_ms = overhead + per_token * uncached`` over ``(uncached,
    ttft_ms)`` pairs: ``(per_token, overhead)``, ``None`` with under 8 pairs, no spread or
    no time a token (a slope not above zero: TTFT that the tokens do not move)."""
    if len(pairs) < 8 or len({x for x, _ in pairs}) < 2:
        return None
    x, y = np.array(pairs, dtype=float).T
    slope, intercept = np.polyfit(x, y, 1)
    return (float(slope), max(float(intercept), 0.0)) if slope > 0 else None


def calibrate(replicas: Sequence[Replica], prompts: Sequence[tuple[str, int]], *,
              max_tokens: int) -> tuple[float, float] | None:
    """The engines' TTFT model without queueing (the simulator's
    :class:`~canopy.prefix.ttft.TTFTModel`, which queues by itself): ``prompts`` (text and
    its length in the engine's tokens) sent one at a time straight to the replicas in turn,
    after one untimed request a replica (an engine's first answer pays its start-up), each
    request's uncached tokens its length times one less the hit rate its replica's counters
    moved by; ``(per_token_ms, overhead_ms)`` as ``_fit`` returns it."""
    import httpx

    pairs = []
    with httpx.Client(timeout=600.0) as client:
        for replica in replicas:
            send(client, replica.url, replica.model, " hello", max_tokens, replica.headers)
        for i, (prompt, length) in enumerate(prompts):
            replica = replicas[i % len(replicas)]
            before = replica.counters()
            outcome = send(client, replica.url, replica.model, prompt, max_tokens,
                           replica.headers)
            hits, queries = np.subtract(replica.counters(), before)
            if outcome.error is None:
                pairs.append((length * (1.0 - (hits / queries if queries else 0.0)),
                              outcome.ttft_s * 1000.0))
    return _fit(pairs)


CALIBRATION_PER_REPLICA = 3
"""Calibration requests (:func:`calibrate`) a replica."""


def calibration_prompts(words: Sequence[str], vocab: Any, n: int, *, low: int, high: int,
                        bos: bool, seed: int) -> list[tuple[str, int]]:
    """``n`` prompts of random words (sharing no prefix but by chance), their lengths
    spread evenly over ``low`` to ``high`` tokens: each as text (engines such as
    llama.cpp's server take no token ids) and its length as the engine tokenizes it
    (``bos``: llama.cpp's)."""
    rng = np.random.default_rng(seed)
    out = []
    for length in np.linspace(low, max(high, low), n).round().astype(int):
        text = " " + " ".join(rng.choice(words, size=int(length) - bos).tolist())
        out.append((text, len(vocab.tokenize(text.encode(), add_bos=bos, special=True))))
    return out


def fit_ttft(runs: dict[str, RouterRuns], prompt_tokens: Sequence[Sequence[Sequence[int]]]
             ) -> tuple[float, float] | None:
    """Least-squares ``ttft_ms = overhead + per_token * uncached`` over every served request
    of every router (the TTFT model of the simulator, :class:`~canopy.prefix.ttft.TTFTModel`,
    as the loaded machine shows it); a request's uncached tokens are its prompt less the
    cached tokens its engine reported, or, where the engine reports none per request (llama.cpp),
    its prompt times one less its engines' hit rate in that repeat. ``None``: too few
    requests or no spread."""
    pairs = []
    for per in runs.values():
        for rep, hit, sent in zip(per.outcomes, per.hit_rate, prompt_tokens, strict=True):
            pairs += [(len(t) - o.cached_tokens if o.cached_tokens >= 0 else
                       len(t) * (1.0 - hit), o.ttft_s * 1000.0)
                      for o, t in zip(rep, sent, strict=True) if o.error is None]
    return _fit(pairs)


def run_bench(*, engine: str, replicas: int, routers: Sequence[str], workload: str,
              requests: int, concurrency: int, repeats: int, seed: int = 0,
              block_tokens: int | None = None, blocks: int = 48, capacity_mb: float = 4.0,
              max_tokens: int = 4, threads: int = 1, ms_per_token: float | None = None,
              overhead_ms: float | None = None, trace_out: Path | None = None,
              progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The whole bench (see the module docstring): returns the ``--json`` object."""
    from canopy.engines.workloads import mooncake_workload, word_vocabulary, zipf_workload
    from canopy.llm.local import find_smollm2_gguf

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    unknown = [r for r in routers if r not in ROUTERS]
    if not routers or unknown:
        raise ValueError(f"unknown router {', '.join(unknown) or '(none)'}; known: "
                         f"{', '.join(ROUTERS)}")
    for value, what in ((replicas, "replicas"), (requests, "requests"),
                        (concurrency, "concurrency"), (repeats, "repeats")):
        check_count(value, what)
    for peer in routers:
        if peer in PEERS:
            peer_binary(peer)  # a missing binary fails before any engine starts
    block = block_tokens or (32 if engine == "vllm" else 16)
    words, vocab = word_vocabulary(find_smollm2_gguf())

    def workload_of(s: int) -> Any:
        if workload == "zipf":
            return zipf_workload(words, requests=requests, scenario="stationary", seed=s,
                                 system_tokens=2 * block, context_tokens=2 * block)
        return mooncake_workload(words, workload, requests=requests, block_tokens=block,
                                 seed=s)

    streams = [workload_of(seed + r) for r in range(repeats)]
    texts = [[w.text(i) for i in range(len(w.prompts))] for w in streams]
    tokens = [[vocab.tokenize(t.encode(), add_bos=engine == "llama", special=True)
               for t in per] for per in texts]
    longest = max(len(t) for per in tokens for t in per) + max_tokens + block
    runs = {name: RouterRuns() for name in routers}
    precise = False
    with ExitStack() as stack:
        fleets = [start_replicas(engine, replicas, stack, block_tokens=block, blocks=blocks,
                                 capacity_mb=capacity_mb, max_model_len=longest,
                                 threads=threads) for _ in routers]
        every = [r for i in range(replicas) for reps in fleets for r in reps[i:i + 1]]
        calibration = calibrate(every, calibration_prompts(
            words, vocab, len(every) * CALIBRATION_PER_REPLICA, low=block,
            high=longest - max_tokens - block, bos=engine == "llama", seed=seed + repeats),
            max_tokens=1)
        # a batched engine pays its overhead once a step, for every request the step holds:
        # a queued request costs the gateway's rule its tokens, not another overhead
        overhead_tokens = None if calibration is None else calibration[1] / calibration[0]
        if SIM_ENGINE[engine] == "batched":
            overhead_tokens = 0.0
        fronts = []
        for name, reps in zip(routers, fleets, strict=True):
            predictions: Callable[[], dict[str, float]] | None = None
            if name in PEERS:
                url = stack.enter_context(peer_router(name, reps))
            elif name == "canopy":
                precise = publishes_events(reps)
                url = stack.enter_context(canopy_gateway(reps, precise=precise,
                                                         overhead_tokens=overhead_tokens))
                predictions = functools.partial(gateway_predictions, url)
            else:
                url = None
            fronts.append(Front(name, tuple(reps), url, predictions))
        headers, model = fronts[0].replicas[0].headers, fronts[0].replicas[0].model
        warm = [" hello"]
        interleave(fronts, warm, model=model, concurrency=1, max_tokens=1, headers=headers)
        for prompts in texts:
            before = {f.name: f.counters() for f in fronts}
            predicted = {f.name: f.predicted() for f in fronts}
            outcomes = interleave(fronts, prompts, model=model, concurrency=concurrency,
                                  max_tokens=max_tokens, headers=headers, progress=progress)
            for front in fronts:
                hits, queries = np.subtract(front.counters(), before[front.name])
                runs[front.name].outcomes.append(outcomes[front.name])
                runs[front.name].hit_rate.append(float(hits / queries) if queries else 0.0)
                runs[front.name].predicted.append({
                    k: v - predicted[front.name].get(k, 0.0)
                    for k, v in front.predicted().items()})
    first = runs[routers[0]].outcomes[0]
    out: dict[str, Any] = {
        "engine": engine, "replicas": replicas, "workload": streams[0].name,
        "requests": requests, "concurrency": concurrency, "repeats": repeats,
        "block_tokens": block, "results": bench_json(runs, tokens),
        "distinct_blocks": len({key for t in tokens[0] for key in _block_ids(t, block)})}
    if "canopy" in out["results"]:
        out["results"]["canopy"]["index"] = "precise" if precise else "approximate"
        out["results"]["canopy"]["overhead_tokens"] = overhead_tokens  # None: the default
    fitted = fit_ttft(runs, tokens)
    out["calibration"] = None if calibration is None else {
        "ms_per_token": calibration[0], "overhead_ms": calibration[1],
        "overhead_tokens": overhead_tokens}
    out["fitted"] = None if fitted is None else {"ms_per_token": fitted[0],
                                                 "overhead_ms": fitted[1]}
    # the loaded fit (the machine's contention between replicas included), else the
    # engines' own model
    per_token, overhead = fitted or calibration or (8.8, 44.0)  # docs/cache.md's llama.cpp
    per_token = ms_per_token if ms_per_token is not None else per_token
    overhead = overhead_ms if overhead_ms is not None else overhead
    file = trace_out or Path(tempfile.gettempdir()) / f"canopy-fleet-bench-{os.getpid()}.jsonl"
    write_mooncake(file, tokens[0], [o.sent_s for o in first], block_tokens=block,
                   output_tokens=max_tokens)
    span = max(o.sent_s for o in first) - min(o.sent_s for o in first)
    capacity = blocks - 2 if engine == "vllm" else _llama_blocks(capacity_mb, block)
    # engines outnumbering the machine's cores saturate it: a router's replicas then share
    # a fixed part of it (the fitted line's speed) however many of them prefill at once
    cores = 1.0 if replicas * len(routers) > (os.cpu_count() or 1) else None
    work_ms = sum(overhead + per_token * len(t) for t in tokens[0])
    load = float(np.clip(work_ms / 1000.0 / (min(replicas, cores or replicas) *
                                             max(span, 1e-3)), 0.05, 0.95))
    out["trace"] = str(file)
    out["simulator"] = predict(file, routers, n_replicas=replicas, capacity_blocks=capacity,
                               load=load, ms_per_token=per_token, overhead_ms=overhead,
                               tpot_ms=per_token, block_tokens=block,
                               precise=precise, engine=SIM_ENGINE[engine], cores=cores)
    out["ranking"] = ranking(out["results"], out["simulator"]["results"])
    return out


def ranking(live: dict[str, Any], simulated: dict[str, Any]) -> dict[str, Any]:
    """The routers ordered by mean TTFT p90, live and in the simulator (routers both have,
    the first of those the simulator plays with one rule: ``vllm-router`` beside
    ``sglang-router`` ties with it there), and whether the two orders agree."""
    first: dict[str, str] = {}
    for name in live:
        if name in simulated:
            first.setdefault(simulated[name].get("policy", name), name)
    both = list(first.values())
    order = {where: sorted(both, key=lambda n: rows[n]["ttft_p90_s"]["mean"])
             for where, rows in (("live", live), ("simulator", simulated))}
    return {**order, "same": order["live"] == order["simulator"]}


def _llama_blocks(capacity_mb: float, block_tokens: int) -> int:
    """Blocks the llama.cpp engine's cache holds (SmolLM2-135M: 23,040 KV bytes a token)."""
    return max(1, int(capacity_mb * 2**20) // (block_tokens * 23_040))
