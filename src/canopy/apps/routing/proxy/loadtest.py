"""A bounded load test of a running routing proxy: ``n`` chat requests, ``concurrency`` at a
time, optional feedback for every answer, and a hook run once halfway (e.g. stopping an
upstream). Every request ends as an HTTP answer or a client-side error; none can hang past
``request_timeout``. The proxy's own added latency is what it reports in
``X-Canopy-Overhead-Ms`` (its handling time minus the time spent waiting on upstreams)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LoadTestResult", "run_load_test"]


@dataclass(frozen=True)
class LoadTestResult:
    """Outcome of :func:`run_load_test`; latencies in milliseconds."""

    requests: int
    status: dict[int, int]
    client_errors: list[str]
    models: dict[str, int]
    latency_ms: np.ndarray
    overhead_ms: np.ndarray
    duration_s: float
    feedback_status: dict[int, int] = field(default_factory=dict)
    error_bodies: list[str] = field(default_factory=list)
    fallbacks: int = 0

    @property
    def answered(self) -> int:
        return sum(self.status.values())

    @property
    def throughput(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else float("nan")

    def percentile(self, which: str, q: float) -> float:
        values = self.overhead_ms if which == "overhead" else self.latency_ms
        return float(np.percentile(values, q)) if values.size else float("nan")

    def summary(self) -> dict[str, object]:
        return {"requests": self.requests, "answered": self.answered,
                "status": self.status, "client_errors": len(self.client_errors),
                "models": self.models, "duration_s": self.duration_s,
                "throughput_rps": self.throughput,
                "latency_ms_p50": self.percentile("latency", 50),
                "latency_ms_p99": self.percentile("latency", 99),
                "overhead_ms_p50": self.percentile("overhead", 50),
                "overhead_ms_p99": self.percentile("overhead", 99),
                "feedback_status": self.feedback_status,
                "answers_after_a_failed_upstream": self.fallbacks}


async def _run(base_url: str, n: int, concurrency: int, max_tokens: int,
               regions: list[str], quality: Callable[[dict], float] | None,
               halfway: Callable[[], None] | None, request_timeout: float,
               api_key: str | None) -> LoadTestResult:
    import httpx

    status: Counter[int] = Counter()
    feedback_status: Counter[int] = Counter()
    models: Counter[str] = Counter()
    errors: list[str] = []
    error_bodies: list[str] = []
    fallbacks = 0
    latency: list[float] = []
    overhead: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    hook: asyncio.Task | None = None
    limits = httpx.Limits(max_connections=concurrency)
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url, timeout=request_timeout,
                                 limits=limits, headers=auth) as client:

        async def worker() -> None:
            nonlocal hook, fallbacks
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if i == n // 2 and halfway is not None:
                    hook = asyncio.create_task(asyncio.to_thread(halfway))
                body = {"messages": [{"role": "user", "content": f"Say a number: {i}"}],
                        "max_tokens": max_tokens, "temperature": 0.0}
                t0 = time.perf_counter()
                try:
                    answer = await client.post("/v1/chat/completions", json=body,
                                               headers={"X-Canopy-Region":
                                                        regions[i % len(regions)]})
                except httpx.HTTPError as error:
                    errors.append(f"request {i}: {type(error).__name__}: {error}")
                    continue
                latency.append((time.perf_counter() - t0) * 1000.0)
                status[answer.status_code] += 1
                if answer.status_code != 200:
                    error_bodies.append(answer.text[:500])
                    continue
                overhead.append(float(answer.headers["X-Canopy-Overhead-Ms"]))
                data = answer.json()
                models[data["canopy"]["model"]] += 1
                fallbacks += bool(data["canopy"]["failed_attempts"])
                if quality is not None:
                    try:
                        rated = await client.post("/v1/feedback", json={
                            "request_id": data["canopy"]["request_id"],
                            "quality": quality(data)})
                        feedback_status[rated.status_code] += 1
                    except httpx.HTTPError as error:
                        errors.append(f"feedback {i}: {type(error).__name__}: {error}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        duration = time.perf_counter() - started
        if hook is not None:
            await hook
    return LoadTestResult(n, dict(status), errors, dict(models), np.array(latency),
                          np.array(overhead), duration, dict(feedback_status), error_bodies,
                          fallbacks)


def run_load_test(base_url: str, *, requests: int = 1000, concurrency: int = 32,
                  max_tokens: int = 2, regions: list[str] | None = None,
                  quality: Callable[[dict], float] | None = None,
                  halfway: Callable[[], None] | None = None,
                  request_timeout: float = 120.0, api_key: str | None = None
                  ) -> LoadTestResult:
    """Drive the proxy at ``base_url``; ``quality(answer_json)`` rates each answer (feedback
    is sent when given, so ``api_key`` must then be the admin key); ``halfway()`` runs once,
    in a thread, when request ``n // 2`` starts."""
    if requests < 1 or concurrency < 1:
        raise ValueError("requests and concurrency must be >= 1")
    return asyncio.run(_run(base_url, requests, concurrency, max_tokens,
                            regions or [""], quality, halfway, request_timeout, api_key))
