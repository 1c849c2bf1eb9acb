"""The upstreams behind the routing proxy, as the proxy calls them. The routing service
chooses a *model* (:meth:`~canopy.regional.service.RoutingService.route`); the proxy then
asks that model's :class:`UpstreamPool` which replicas serve the call, in order
(:meth:`UpstreamPool.pick`): the first is the replica policy's choice
(:func:`canopy.fleet.make_policy`, reading the replica index and the load table of
:mod:`canopy.fleet`), the rest the failover order (least loaded first). A replica that fails
leaves the rotation and the index at once and is re-admitted by a background probe
(``GET {url}/models``) when it answers again.

What the policy learns from: a streamed request's time to its first byte (its TTFT); a
non-streamed one teaches the trade-off nothing (its latency mixes prefill and decode), but
its ``usage.prompt_tokens_details.cached_tokens`` calibrates an approximate index's TTL like
a stream's does. A learning policy's statistics (the ``canopy`` policy's trade-off, per
region of the prefix tree) live in the proxy's store, under the namespace ``fleet/<model>``,
through a :class:`~canopy.regional.service.RoutingService` of their own: every gateway on one
store (every worker of one, every gateway on one Redis) learns one trade-off, and it outlives
a restart as the routing statistics do; each keeps its own replica index and load table.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from canopy.apps.routing.proxy.config import Upstream
from canopy.fleet import load as load_module
from canopy.fleet.load import INFLIGHT, QUEUED, QUEUED_TOKENS
from canopy.llm.passthrough import AsyncPassthrough
from canopy.regional.service import RoutingService
from canopy.regional.store import StoreBusy

__all__ = ["PROBE_INTERVAL_S", "Pick", "UpstreamPool", "unanswered"]

log = logging.getLogger("canopy.proxy")
PROBE_INTERVAL_S = 0.5
"""How often a replica that failed is asked whether it answers again."""
GATEWAY_DOWN = frozenset({502, 503, 504})
"""Statuses of a replica that is not serving (any other answer: it is up)."""
CAPACITY_BLOCKS = 1 << 20
"""KV blocks per replica in the load table (its KV-use row is not read by the default
policies)."""


@dataclass
class Pick:
    """One request's replica choice: the order to try, its block keys and prompt tokens,
    the blocks each replica held (``matched``), and an id for the policy's feedback."""

    order: list[int]
    keys: np.ndarray
    tokens: int
    matched: list[int]
    rid: int
    sent: float = 0.0
    first: bool = False


class UpstreamPool:
    """One model's upstream (:class:`~canopy.apps.routing.proxy.config.Upstream`): a client
    per replica (answers of at most ``max_answer_bytes``), and, with several replicas, the
    replica policy, index, load table and health. A learning policy keeps its statistics in
    ``store`` (a URL; ``None``: in memory, this pool's own), waiting at most ``wait_s``."""

    def __init__(self, config: Upstream, *, max_answer_bytes: int,
                 metrics: Any = None, store: str | None = None, wait_s: float = 0.5) -> None:
        self.config = config
        self.metrics = metrics
        self.urls = [r.url for r in config.replicas]
        self._replicas = tuple(
            AsyncPassthrough(r.url, model=config.upstream_model,
                             api_key_env=config.api_key_env,
                             max_answer_bytes=max_answer_bytes) for r in config.replicas)
        self.up = [True] * len(self._replicas)
        self._everyone = list(range(len(self._replicas)))  # read only
        self.fleet = len(self._replicas) > 1
        self.subscriber: Any = None
        self._rid = itertools.count()
        self._probe: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        self.shared: RoutingService | None = None
        if not self.fleet:
            return
        from canopy.fleet import Load, ReplicaIndex, Request, View, make_policy
        from canopy.fleet.tokens import PromptTokenizer

        self._request = Request  # the fleet extra's, imported once (not per request)

        settings = config.index
        self.block_size = int(settings.get("block_size", 16))
        self.mode = settings.get("mode", "approximate")
        self.ttl_s = float(settings.get("ttl_s", 180.0))
        self.policy = make_policy(config.replica_policy, **config.replica_options)
        if self.policy.router is not None and store is not None:
            try:
                self.shared = RoutingService(self.policy.router, store,
                                             namespace=f"fleet/{config.model}", wait_s=wait_s)
            except (ValueError, StoreBusy) as error:
                raise ValueError(f"upstream {config.model!r}: cannot keep the replica "
                                 f"policy's statistics in {store}: {error}") from None
            self.policy.report = self.shared.observe
        self.index = ReplicaIndex(len(self._replicas), mode=self.mode, ttl_s=self.ttl_s)
        self.load = Load(len(self._replicas), capacity_blocks=CAPACITY_BLOCKS)
        self.view = View(self.index, self.load, block_tokens=self.block_size)
        tokenizer = settings.get("tokenizer") or next(
            (r.tokenizer for r in config.replicas if r.tokenizer), None)
        self.tokenizer = PromptTokenizer(tokenizer)
        if self.mode == "precise" and not self.tokenizer.exact:
            raise ValueError(f"upstream {config.model!r}: a precise index needs the served "
                             "model's tokenizer ('index': {'tokenizer': PATH})")

    @property
    def timeout_s(self) -> float:
        """The longest one call to this upstream may take (within the request's deadline)."""
        return self.config.timeout_s

    def replica(self, body: Mapping[str, Any]) -> AsyncPassthrough:
        """The client of the first replica :meth:`pick` gives ``body`` (no bookkeeping)."""
        return self._replicas[self.pick(body).order[0]] if self.fleet else self._replicas[0]

    def client(self, replica: int) -> AsyncPassthrough:
        return self._replicas[replica]

    # -- choice ------------------------------------------------------------------------
    def pick(self, body: Mapping[str, Any]) -> Pick:
        """The replicas to try for ``body``, the policy's choice first."""
        if not self.fleet:
            return Pick([0], _NO_KEYS, 0, [0], 0)
        keys, tokens = self.tokenizer.keys(body, self.block_size)
        view = self.view
        view.now = time.monotonic()
        rid = next(self._rid)
        if self.shared is None:
            chosen = self.policy.choose_keys(keys, tokens, rid, view)
        else:
            with self.shared.reading():
                chosen = self.policy.choose_keys(keys, tokens, rid, view)
        matched = view.matched(keys).tolist()
        up = self.up
        alive = self._everyone if all(up) else \
            [r for r in range(len(up)) if up[r]] or self._everyone
        rest = [r for r in alive if r != chosen]
        if len(rest) > 1:  # the others, least in flight first
            rest.sort(key=self.load.table[INFLIGHT].tolist().__getitem__)
        order = [chosen, *rest] if chosen in alive else rest
        if chosen not in alive and self.metrics is not None:
            self.metrics.count(self.metrics.replica_fallbacks, self.config.model,
                               self.urls[chosen])
        return Pick(order, keys, tokens, matched, rid)

    def sent(self, pick: Pick, replica: int) -> None:
        """``pick``'s request goes to ``replica``."""
        pick.sent, pick.first = time.perf_counter(), False
        if not self.fleet:
            return
        if self.metrics is not None:
            self.metrics.count(self.metrics.replica_picks, self.config.model,
                               self.urls[replica])
        cached = min(pick.matched[replica] * self.block_size, pick.tokens)
        load_module.routed(self.load.table, replica, float(pick.tokens - cached),  # checked
                           float(pick.keys.size), float(self.load.capacity_blocks))
        if self.index.mode == "approximate":
            self.index.sent(replica, pick.keys, time.monotonic())

    def first_token(self, pick: Pick, replica: int, *, learn: bool) -> None:
        """The first byte of ``pick``'s answer came from ``replica``; its TTFT teaches the
        policy when ``learn`` (streams)."""
        if not self.fleet:
            return
        pick.first = True
        ttft = time.perf_counter() - pick.sent
        cached = min(pick.matched[replica] * self.block_size, pick.tokens)
        load_module.first_token(self.load.table, replica, float(pick.tokens - cached), ttft)
        if learn and self.policy.learns:
            self.policy.observe(self._request(pick.keys, pick.tokens, pick.rid), replica, ttft)

    def finished(self, pick: Pick, replica: int, usage: Mapping[str, Any] | None) -> None:
        """``pick``'s answer from ``replica`` ended; ``usage``'s cached tokens (when the
        engine reports them) calibrate an approximate index."""
        if not self.fleet:
            return
        load_module.finished(self.load.table, replica, float(pick.keys.size),
                             float(self.load.capacity_blocks))
        details = (usage or {}).get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
            self.index.reported(pick.matched[replica], cached // self.block_size)
            if self.metrics is not None:
                predicted = self.predicted_cached(pick, replica)
                self.metrics.count(self.metrics.cache_predictions, self.config.model,
                                   "exact" if predicted == cached else
                                   "over" if predicted > cached else "under")

    def predicted_cached(self, pick: Pick, replica: int) -> int:
        """The prompt tokens the index predicted ``replica`` had cached for ``pick``: its
        matched full blocks, at most those before the prompt's last token (an engine computes
        at least that one, as vLLM's cache lookup does)."""
        return min(pick.matched[replica],
                   max(pick.tokens - 1, 0) // self.block_size) * self.block_size

    def failed(self, pick: Pick, replica: int, *, down: bool) -> None:
        """``replica`` failed ``pick``'s request; ``down``: it is taken out of the rotation
        (and its blocks out of the index) until the probe sees it answer again."""
        if not self.fleet:
            return
        table = self.load.table
        if not pick.first:  # it never got its first token: it leaves the queue too
            cached = min(pick.matched[replica] * self.block_size, pick.tokens)
            table[QUEUED, replica] = max(table[QUEUED, replica] - 1.0, 0.0)
            table[QUEUED_TOKENS, replica] = max(
                table[QUEUED_TOKENS, replica] - (pick.tokens - cached), 0.0)
        self.load.finished(replica, float(pick.keys.size))
        if self.metrics is not None:
            self.metrics.count(self.metrics.replica_fallbacks, self.config.model,
                               self.urls[replica])
        if down and self.up[replica]:
            self.mark_down(replica)

    def mark_down(self, replica: int) -> None:
        self.up[replica] = False
        self.index.cleared(replica)
        log.warning("upstream %s: replica %s is down; probing it every %g s",
                    self.config.model, self.urls[replica], PROBE_INTERVAL_S)

    def warm_up(self, body: Mapping[str, Any]) -> None:
        """Compile the policy's and the index's kernels on a scratch copy (no state kept)."""
        if not self.fleet:
            return
        from canopy.fleet import Load, ReplicaIndex, Request, View, make_policy

        index = ReplicaIndex(len(self._replicas), mode=self.index.mode, ttl_s=self.ttl_s)
        view = View(index, Load(len(self._replicas), capacity_blocks=CAPACITY_BLOCKS),
                    block_tokens=self.block_size)
        keys, tokens = self.tokenizer.keys(body, self.block_size)
        make_policy(self.config.replica_policy,
                    **self.config.replica_options).choose(Request(keys, tokens), view)
        if index.mode == "approximate":
            index.sent(0, keys, 0.0)

    # -- health ------------------------------------------------------------------------
    async def answers(self, replica: int, timeout: float = 2.0) -> bool:
        """Whether ``replica`` answers ``GET /models``."""
        if self._http is None:
            self._http = httpx.AsyncClient()
        try:
            response = await self._http.get(f"{self.urls[replica]}/models", timeout=timeout)
        except httpx.HTTPError:
            return False
        return response.status_code not in GATEWAY_DOWN

    async def start(self) -> None:
        """Start the health probe and, for a precise index, the KV-event subscriber."""
        if not self.fleet:
            return
        self._probe = asyncio.get_running_loop().create_task(self._watch())
        if self.mode == "precise":
            from canopy.fleet.subscriber import EventSource, EventSubscriber

            sources = [EventSource(i, r.events_endpoint, r.events_topic, r.replay_endpoint,
                                   r.block_size or self.block_size)
                       for i, r in enumerate(self.config.replicas)
                       if r.events_endpoint is not None]
            metrics = self.metrics
            self.subscriber = EventSubscriber(
                self.index, sources,
                max_bytes=int(self.config.index.get("max_event_bytes", 4 << 20)),
                allow_remote=self.config.allow_remote_events, on_gap_lost=self._approximate,
                on_drop=None if metrics is None else lambda reason: metrics.events_dropped
                .labels(model=self.config.model, reason=reason).inc())
            self.subscriber.start()

    def _approximate(self, replica: int) -> None:
        """Events lost for good: the index becomes an approximate one (routing history)."""
        from canopy.fleet import ReplicaIndex

        self.index = ReplicaIndex(len(self._replicas), mode="approximate", ttl_s=self.ttl_s)
        self.view.index = self.index

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            for replica in [r for r, up in enumerate(self.up) if not up]:
                if await self.answers(replica, timeout=PROBE_INTERVAL_S):
                    self.up[replica] = True
                    log.warning("upstream %s: replica %s answers again; re-admitted",
                                self.config.model, self.urls[replica])
            if self.index.mode == "approximate":
                self.index.expire(time.monotonic())
            self.report()

    def report(self) -> None:
        """Refresh the pool's gauges (index size, event lag, the trade-off played)."""
        if self.metrics is None or not self.fleet:
            return
        self.metrics.index_blocks.labels(model=self.config.model).set(self.index.n_blocks)
        router = self.policy.router
        if router is not None:
            with contextlib.nullcontext() if self.shared is None else self.shared.reading():
                played = router.played()
            for region, theta in played.items():
                self.metrics.replica_tradeoff.labels(model=self.config.model,
                                                     region=region).set(theta)
        if self.subscriber is not None:
            for replica, lag in self.subscriber.lag_s.items():
                self.metrics.event_lag.labels(model=self.config.model,
                                              replica=self.urls[replica]).set(lag)

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self.subscriber is not None:
            await self.subscriber.aclose()
        if self._http is not None:
            await self._http.aclose()
        for client in self._replicas:
            await client.aclose()
        if self.shared is not None:
            await asyncio.to_thread(self.shared.close)


_NO_KEYS = np.zeros(0, dtype=np.int64)


def unanswered(config: Upstream, timeout: float = 3.0) -> list[str]:
    """The URLs of ``config``'s replicas that do not answer ``GET /models`` now (checked
    at start: a model none of whose replicas answers is refused)."""
    down = []
    with httpx.Client(timeout=timeout) as http:
        for replica in config.replicas:
            try:
                if http.get(f"{replica.url}/models").status_code not in GATEWAY_DOWN:
                    continue
            except httpx.HTTPError:
                pass
            down.append(replica.url)
    return down
