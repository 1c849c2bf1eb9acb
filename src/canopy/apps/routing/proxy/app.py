"""The OpenAI-compatible routing proxy (paper Section 4, "Routing", as a service).

``POST /v1/chat/completions`` picks a model with the regional router (region from a header,
a regular-expression rule, a user-supplied classifier, or the nearest centroid of a text
embedding), forwards the body to that model's upstream through
:class:`~canopy.llm.passthrough.AsyncPassthrough`, and returns the upstream's answer with the
chosen model and a request id (body field ``canopy`` and headers ``X-Canopy-Model``,
``X-Canopy-Request-Id``). An upstream that fails or times out is skipped for the next model
in the router's ranking, within the request's deadline (enforced on the whole call, however
slowly an upstream drips its answer); an upstream that keeps failing is ejected for a
cool-down (circuit breaker). When none answers, the caller gets a 503 (504 past the
deadline, 502 when the upstreams refused the proxy's credentials) with a generic reason and
the request id; upstream error bodies go only to the log, secrets redacted.
``POST /v1/feedback`` takes ``{"request_id", "quality"}`` and updates the router with
``quality - lam * cost`` through the routing service (:mod:`canopy.regional.service`): the
store first (one atomic step), then memory, so a retry after a failure counts once, and every
worker sharing the store ranks with it within a second. A store that stays busy past
``limits.store_wait_s`` gets the rating a 503 with ``Retry-After``; it never delays a chat
(the call is stored in the background). Calls sent with an ``X-Canopy-Episode`` header
form an episode: ``POST /v1/feedback/episode`` with ``{"episode_id", "reward"}`` credits the
terminal reward to every call of the episode not yet rated, in one transaction (per-call
routing inside agents, paper Appendix E). ``GET /v1/router/stats``, ``GET /metrics``
(Prometheus), ``GET /health``.
A request may carry its own trade-off in a ``"canopy"`` object (``extra_body``): ``lam`` and
``max_cost`` (:class:`~canopy.apps.routing.proxy.guard.Preferences`).

Secure by default: chat needs the client (or admin) key, feedback and statistics the admin
key (``Authorization: Bearer ...``); bodies over ``limits.max_body_bytes`` get 413; the
region table holds at most ``limits.max_regions`` regions (a new region past that, or one
outside ``region.allowed``, is served as its nearest known ancestor).

Needs the ``serve`` extra (fastapi, uvicorn, httpx); nothing else imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from canopy.apps.routing.proxy.config import Limits, ProxyConfig
from canopy.apps.routing.proxy.connections import LeanRoutes
from canopy.apps.routing.proxy.guard import (
    Keys,
    Preferences,
    SseUsage,
    check_chat_body,
    check_completion_body,
    client_fault,
    completion_view,
    expected_tokens,
    redact,
    sane_usage,
)
from canopy.apps.routing.proxy.metrics import CONTENT_TYPE_LATEST, ProxyMetrics
from canopy.apps.routing.proxy.upstreams import Pick, UpstreamPool
from canopy.apps.routing.proxy.web import (
    JSONAnswer,
    RawHeaders,
    checked_json,
    rating_route,
    read_json,
    refusal,
    refused,
)
from canopy.apps.routing.proxy.web import error_json as _error
from canopy.llm.client import (
    LLMConnectionError,
    LLMError,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
)
from canopy.llm.http1 import Once
from canopy.llm.passthrough import AnswerTooLarge, AsyncPassthrough
from canopy.regional.outcomes import Outcomes
from canopy.regional.service import Route, RoutingService
from canopy.regional.sources import RegionSource
from canopy.regional.store import Call, StoreBusy

__all__ = ["AUTO_MODELS", "app_from_env", "create_app", "read_prior", "serve_in_thread"]

AUTO_MODELS = frozenset({"", "auto", "canopy-router"})
EPISODE_HEADER = "X-Canopy-Episode"  # groups an agent's calls for episode feedback
CONFIG_ENV = "CANOPY_PROXY_CONFIG"  # what ``serve router --workers N`` hands its workers
INSECURE_ENV = "CANOPY_PROXY_INSECURE_NO_AUTH"
PRIOR_ENV = "CANOPY_PROXY_PRIOR"  # ``--prior LOG`` for the workers
log = logging.getLogger("canopy.proxy")
_T = TypeVar("_T")
# what a failed upstream attempt raises: the proxy moves on to the next model
_UPSTREAM_FAILURES = (LLMError, asyncio.TimeoutError, httpx.HTTPError)


if sys.version_info >= (3, 11):
    async def _within(awaitable: Awaitable[_T], timeout: float) -> _T:
        """``awaitable`` within ``timeout`` s (``TimeoutError`` past it), in this task (no
        task per call, as ``asyncio.wait_for`` makes before Python 3.12)."""
        async with asyncio.timeout(timeout):
            return await awaitable
else:  # pragma: no cover
    _within = asyncio.wait_for


def _reason(error: LLMError) -> str:
    """What a client may learn about a failed upstream call: its kind, never its body."""
    if isinstance(error, AnswerTooLarge):
        return "too large"
    if isinstance(error, LLMTimeoutError):
        return "timeout"
    if isinstance(error, LLMServerError):
        return f"http {error.status}"
    return "unreachable" if isinstance(error, LLMConnectionError) else "bad response"


def _usage(raw: Any) -> Any:
    """An answer's ``usage`` (``None`` when it is not an object's)."""
    return raw.get("usage") if isinstance(raw, dict) else None


class _Call(NamedTuple):
    """One routed request: its endpoint, the body forwarded, the chat-shaped view the router
    reads (:func:`completion_view` for text completions), and its bookkeeping (a tuple: made
    once a chat, it costs less than a frozen dataclass)."""

    endpoint: str
    body: dict[str, Any]
    view: dict[str, Any]
    region: str
    request_id: str
    episode: str | None
    deadline: float  # time.perf_counter() at which it ends, streams included


class _Served(NamedTuple):
    """Which replica of which pool answers a call (its bookkeeping when it ends)."""

    pool: UpstreamPool | None
    pick: Pick
    replica: int

    def finished(self, usage: Any) -> None:
        if self.pool is not None:
            self.pool.finished(self.pick, self.replica,
                               usage if isinstance(usage, dict) else None)

    def gone(self) -> _Served:
        """Already accounted for (its replica failed)."""
        return _Served(None, self.pick, self.replica)


class _Proxy:
    """The proxy's state and logic, apart from the web framework. It decides nothing: the
    routing service chooses (:meth:`RoutingService.route`) and learns
    (:meth:`~RoutingService.outcome`, :meth:`~RoutingService.record`,
    :meth:`~RoutingService.rate`); the proxy forwards, prices and answers."""

    def __init__(self, config: ProxyConfig, keys: Keys, prior: Outcomes | None = None
                 ) -> None:
        self.config = config
        self.keys = keys
        limits = config.limits
        router = config.router()
        if prior is not None:  # kept by the service as a prior under the stored sums
            router.fit(prior)
        try:
            self.service = RoutingService(
                router, config.store,
                regions=RegionSource(config.region, max_regions=limits.max_regions),
                window_s=limits.feedback_window_s, breaker_failures=limits.breaker_failures,
                breaker_cooldown_s=limits.breaker_cooldown_s, wait_s=limits.store_wait_s)
        except ValueError as error:
            raise ValueError(f"{config.store} holds another router's state: {error}; "
                             "use a new store") from None
        except StoreBusy as error:
            raise ValueError(f"cannot open the store {config.store}: {error}") from None
        cap = limits.max_answer_bytes
        self.metrics = ProxyMetrics()
        self.upstreams = {u.model: UpstreamPool(u, max_answer_bytes=cap, metrics=self.metrics,
                                                store=config.store,
                                                wait_s=limits.store_wait_s)
                          for u in config.upstreams}
        self.embedders = {u.model: UpstreamPool(u, max_answer_bytes=cap)
                          for u in config.embeddings}
        self.secrets = keys.secrets + tuple(os.environ.get(u.api_key_env, "")
                                            for u in (*config.upstreams, *config.embeddings)
                                            if u.api_key_env)
        self._id_prefix = f"req-{uuid.uuid4().hex[:16]}"
        self._id_count = itertools.count()

    def _request_id(self) -> str:
        """A new request id: this proxy's random 64-bit prefix and a counter (unique among
        the proxies sharing a store, with no draw of randomness per request)."""
        return f"{self._id_prefix}{next(self._id_count):08x}"

    async def _record(self, request_id: str, region: str, model: str, cost: float,
                      episode: str | None) -> None:
        """Keep an answered request for its feedback (waiting at most ``store_wait_s`` for
        the store: past that the call is stored in the background), so a rating through any
        process sharing the store finds it; a store only this process reads is not waited
        for (a rating of a call still queued waits for it)."""
        stored = self._keep(request_id, region, model, cost, episode)
        if not self.service.shared_store:
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(stored)),
                                   timeout=self.config.limits.store_wait_s)
        except (asyncio.TimeoutError, StoreBusy) as error:
            log.warning("request %s: its call is not stored yet (%s)", request_id,
                        type(error).__name__)

    def _keep(self, request_id: str, region: str, model: str, cost: float,
              episode: str | None) -> Any:
        """Hand an answered call to the service (:meth:`RoutingService.record`)."""
        return self.service.record(Call(request_id, region, model, cost, time.time(), episode))

    def _settle(self, served: _Served, raw: Any, call: _Call, model: str, cost: float
                ) -> None:
        """A whole answer's bookkeeping once it is written (``after``, :class:`LeanRoutes`):
        its replica's load and index, and, on a store only this process reads (nobody waits
        on it), the call kept for its rating, before the server reads another request."""
        served.finished(_usage(raw))
        if not self.service.shared_store:
            self._keep(call.request_id, call.region, model, cost, call.episode)

    def _route(self, headers: Any, view: dict[str, Any], asked: str,
               preferences: Preferences) -> Route:
        """The service's decision for this request: a model asked by name is the only one
        tried; else the router's ranking, re-weighed by the request's own ``lam`` and cut by
        its ``max_cost`` (each model's cost for this request estimated from its prompt and
        ``max_tokens``)."""
        given = headers.get(self.config.region.header)
        if asked in self.upstreams:
            return self.service.route(given, view, allowed=(asked,))
        if preferences.lam is None and preferences.max_cost is None:
            return self.service.route(given, view)
        prompt, completion = expected_tokens(view)
        costs = {m: self.config.prices.cost(m, prompt, completion) for m in self.upstreams}
        return self.service.route(given, view, lam=preferences.lam, costs=costs,
                                  max_cost=preferences.max_cost)

    # -- chat ----------------------------------------------------------------------------
    async def chat(self, headers: Any, body: Any, endpoint: str = "chat/completions"
                   ) -> Response:
        """A chat (or, with ``endpoint="completions"``, a text) completion, routed; streamed
        when the body asks for a stream."""
        started = time.perf_counter()
        problem = (check_chat_body if endpoint == "chat/completions"
                   else check_completion_body)(body)
        if problem:
            return _error(400, problem)
        view = body if endpoint == "chat/completions" else completion_view(body)
        asked = body.get("model", "") or ""
        if asked not in AUTO_MODELS and asked not in self.upstreams:
            return _error(400, f"unknown model {asked!r}: use 'auto' or one of "
                               f"{list(self.upstreams)}", code="model_not_found")
        episode = headers.get(EPISODE_HEADER) or None
        if episode is not None and (len(episode) > 128 or not episode.isprintable()):
            return _error(400, f"{EPISODE_HEADER} must be at most 128 printable characters",
                          code="bad_episode")
        preferences = Preferences.pop(body)
        if isinstance(preferences, str):
            return _error(400, preferences)
        try:
            region, ranking = self._route(headers, view, asked, preferences)
        except ValueError as error:
            return _error(400, f"bad region: {error}", code="bad_region")
        except Exception as error:  # a user classifier's failure is reported, not hidden
            log.error("region classifier failed: %s", redact(repr(error), self.secrets))
            return _error(500, "the region classifier failed", "server_error")
        if not ranking:
            return _error(400, f"no model's estimated cost is within canopy.max_cost "
                               f"({preferences.max_cost:g} $)", code="over_max_cost")
        call = _Call(endpoint, body, view, region, self._request_id(), episode,
                     started + self.config.deadline_s)
        if body.get("stream"):
            streamed = await self._first(call, ranking, self._open_stream)
            if isinstance(streamed, JSONResponse):
                return streamed
            model, (response, chunks, first), _, _, served = streamed
            return StreamingResponse(
                self._relay(call, model, first, chunks, response, served),
                media_type="text/event-stream",
                headers={"X-Canopy-Model": model, "X-Canopy-Request-Id": call.request_id,
                         "X-Canopy-Region": call.region})
        answered = await self._first(call, ranking, self._ask)
        if isinstance(answered, JSONResponse):
            return answered
        model, answer, attempts, upstream_s, served = answered
        try:
            prompt, completion, usage = sane_usage(view, len(answer.text), answer.raw,
                                                   answer.prompt_tokens, answer.completion_tokens)
            cost = self.config.prices.cost(model, prompt, completion)
            if self.service.shared_store:  # stored (or waited for) before the answer
                await self._record(call.request_id, region, model, cost, episode)
            overhead_ms = (time.perf_counter() - started - upstream_s) * 1000.0
            out = dict(answer.raw)
            out["model"] = model
            out["canopy"] = {"request_id": call.request_id, "model": model, "region": region,
                             "episode": episode, "cost": cost, "usage": usage,
                             "failed_attempts": [{"model": a["model"], "reason": a["reason"]}
                                                 for a in attempts],
                             "upstream_ms": upstream_s * 1000.0, "overhead_ms": overhead_ms}
            reply = JSONAnswer(out, headers={"X-Canopy-Model": model,
                                             "X-Canopy-Request-Id": call.request_id,
                                             "X-Canopy-Usage": usage,
                                             "X-Canopy-Overhead-Ms": f"{overhead_ms:.3f}"})
            reply.after = functools.partial(self._settle, served, answer.raw, call, model, cost)
        except BaseException:  # never answered: its replica is released now
            served.finished(_usage(answer.raw))
            raise
        return reply

    @staticmethod
    async def _ask(client: AsyncPassthrough, call: _Call, budget: float,
                   written: Callable[[], None]) -> Any:
        """One upstream's whole answer; ``written`` once the request is out (the lean client
        calls it after its write: the send's bookkeeping overlaps the upstream's work)."""
        return await client.chat(call.body, timeout=budget, endpoint=call.endpoint,
                                 written=written)

    @staticmethod
    async def _open_stream(client: AsyncPassthrough, call: _Call, budget: float,
                           written: Callable[[], None]
                           ) -> tuple[Any, AsyncIterator[bytes], bytes]:
        """One upstream's event stream, up to its first byte (closed if that never comes);
        ``written`` first."""
        written()
        response = await client.open_stream(call.body, timeout=budget, endpoint=call.endpoint)
        try:
            chunks = response.aiter_raw()
            return response, chunks, await anext(chunks)
        except StopAsyncIteration:
            await response.aclose()
            raise LLMResponseError("the stream ended before its first byte") from None
        except BaseException:
            await response.aclose()
            raise

    async def _first(self, call: _Call, ranking: Sequence[str],
                     attempt: Callable[[AsyncPassthrough, _Call, float, Callable[[], None]],
                                       Awaitable[_T]]
                     ) -> tuple[str, _T, list[dict[str, Any]], float, _Served] | JSONResponse:
        """The failover of chats and streams alike: ``attempt`` on each model of
        ``ranking`` in turn (on the replica its upstream names), each within its timeout and
        all within the request's deadline, until one succeeds: ``(model, what it gave, the
        failed attempts, seconds spent on upstreams)``; when none does, the answer saying
        so. Every outcome reaches the service's breaker."""
        attempts: list[dict[str, Any]] = []
        upstream_s = 0.0
        expired = False  # an attempt cut by the deadline itself, not its own timeout
        streaming = attempt is self._open_stream
        for model in ranking:
            upstream = self.upstreams[model]
            pick = upstream.pick(call.body)
            for replica in pick.order:
                remaining = call.deadline - time.perf_counter()
                if remaining <= 0:
                    break
                budget = min(remaining, upstream.timeout_s)
                t0 = time.perf_counter()
                written = Once(functools.partial(upstream.sent, pick, replica))
                client = upstream.client(replica)
                try:  # the deadline holds for the whole call, not per read
                    result = await (attempt(client, call, budget, written) if not streaming
                                    and client.whole_deadline else
                                    _within(attempt(client, call, budget, written), budget))
                except _UPSTREAM_FAILURES as error:
                    written()  # (called already unless it failed before its write)
                    status = getattr(error, "status", None)
                    timed_out = isinstance(error, (asyncio.TimeoutError, LLMTimeoutError))
                    expired = expired or (timed_out and budget == remaining)
                    upstream.failed(pick, replica,
                                    down=not client_fault(status) and not timed_out)
                    attempts.append(self._attempt_failed(
                        model, error, call.request_id,
                        breaker=replica == pick.order[-1] or not upstream.fleet))
                    continue
                finally:
                    written()
                    upstream_s += time.perf_counter() - t0
                upstream.first_token(pick, replica, learn=streaming)
                self.service.outcome(model, ok=True)
                return model, result, attempts, upstream_s, _Served(upstream, pick, replica)
        expired = expired or time.perf_counter() >= call.deadline
        return self._failed(attempts, call.request_id, expired)

    def _failed(self, attempts: list[dict[str, Any]], request_id: str, expired: bool
                ) -> JSONResponse:
        """The answer when no upstream answered: a generic reason per attempt; a 504 when
        the deadline ``expired`` (a timer may fire a clock tick before it, so an attempt the
        deadline cut counts as well as the clock)."""
        public = [{"model": a["model"], "reason": a["reason"]} for a in attempts]
        statuses = [a["status"] for a in attempts]
        if attempts and all(s in (401, 403) for s in statuses):
            return _error(502, "the upstreams refused the proxy's credentials",
                          "upstream_error", request_id=request_id, attempts=public)
        if attempts and all(s in (400, 404, 413, 422) for s in statuses):
            return _error(400, "every upstream rejected the request", request_id=request_id,
                          attempts=public)
        if expired:
            return _error(504, f"no upstream answered within the {self.config.deadline_s:g} s "
                               "deadline", "timeout", request_id=request_id, attempts=public)
        return _error(503, "no upstream answered", "upstream_error", request_id=request_id,
                      attempts=public)

    def _attempt_failed(self, model: str, error: BaseException, request_id: str, *,
                        breaker: bool = True) -> dict[str, Any]:
        """Count a failed upstream call (breaker, redacted log); the attempt's public record.
        A rejection that blames the request (:func:`client_fault`) is not the upstream's
        failure: the breaker does not count it."""
        if not isinstance(error, LLMError):  # past the deadline, or a stream that broke
            error = LLMTimeoutError("deadline") if isinstance(error, asyncio.TimeoutError) \
                else LLMResponseError(f"the stream broke before its first byte "
                                      f"({type(error).__name__})")
        status = getattr(error, "status", None)
        if breaker and not client_fault(status):  # a model's last replica, or its only one
            self.service.outcome(model, ok=False)
        self.metrics.count(self.metrics.failovers, model)
        log.warning("request %s: upstream %s failed: %s", request_id, model,
                    redact(str(error), self.secrets))
        return {"model": model, "reason": _reason(error), "status": status}

    async def _relay(self, call: _Call, model: str, first: bytes,
                     chunks: AsyncIterator[bytes], response: Any, served: _Served
                     ) -> AsyncIterator[bytes]:
        """The upstream's events, until it ends, the request's deadline passes or the
        answer exceeds ``limits.max_answer_bytes`` (then a last ``error`` event says why);
        the call is recorded whatever happens, and a failure to record never cuts the
        stream."""
        events = SseUsage()
        cap = self.config.limits.max_answer_bytes
        sent, cut = 0, None
        try:
            chunk = first
            while True:
                events.feed(chunk)
                sent += len(chunk)
                yield chunk
                if sent >= cap:
                    cut = f"the answer exceeds the proxy's {cap}-byte limit"
                    break
                remaining = call.deadline - time.perf_counter()
                try:
                    chunk = await asyncio.wait_for(anext(chunks), timeout=max(remaining, 0))
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    cut = f"the stream passed the {self.config.deadline_s:g} s deadline"
                    break
                except httpx.HTTPError as error:
                    log.warning("request %s: stream from %s broke: %s", call.request_id,
                                model, redact(str(error), self.secrets))
                    cut = "the upstream's stream broke"
                    if served.pool is not None:
                        served.pool.failed(served.pick, served.replica, down=True)
                    served = served.gone()
                    break
            if cut is not None:
                log.warning("request %s: stream from %s cut: %s", call.request_id, model, cut)
                yield b"\n\ndata: " + json.dumps({"error": {
                    "message": cut, "type": "upstream_error",
                    "request_id": call.request_id}}).encode() + b"\n\n"
        finally:
            await response.aclose()
            usage = events.usage or {}
            served.finished(usage)
            try:
                prompt, completion, _ = sane_usage(
                    call.view, events.chars, {"usage": usage} if events.usage else {},
                    usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))
                cost = self.config.prices.cost(model, prompt, completion)
                await self._record(call.request_id, call.region, model, cost, call.episode)
            except Exception as error:  # the client's stream has been sent whole already
                log.error("request %s: the streamed call was not recorded: %s",
                          call.request_id, redact(repr(error), self.secrets))

    async def embeddings(self, body: Any) -> JSONResponse:
        """``/v1/embeddings`` passed through to the configured embedding upstream named by
        ``model`` (the only one when ``model`` is absent), within the deadline; nothing is
        routed, priced or learned."""
        if not isinstance(body, dict) or "input" not in body:
            return _error(400, "the body must be a JSON object with 'input'")
        asked = body.get("model") or (next(iter(self.embedders)) if len(self.embedders) == 1
                                      else None)
        if asked not in self.embedders:
            return _error(400, f"unknown embedding model {asked!r}: use one of "
                               f"{list(self.embedders)}", code="model_not_found")
        request_id = self._request_id()
        upstream = self.embedders[asked]
        budget = min(self.config.deadline_s, upstream.timeout_s)
        try:
            raw = await asyncio.wait_for(upstream.replica(body).post(
                "embeddings", body, timeout=budget), timeout=budget)
        except (LLMError, asyncio.TimeoutError) as error:
            error = error if isinstance(error, LLMError) else LLMTimeoutError("deadline")
            log.warning("request %s: embedding upstream %s failed: %s", request_id, asked,
                        redact(str(error), self.secrets))
            status = getattr(error, "status", None)
            code, kind = ((400, "invalid_request_error") if client_fault(status) else
                          (504, "timeout") if isinstance(error, LLMTimeoutError) else
                          (502, "upstream_error"))
            return _error(code, f"the embedding upstream failed ({_reason(error)})", kind,
                          request_id=request_id)
        return JSONAnswer({**raw, "model": asked}, headers={"X-Canopy-Request-Id": request_id})

    def model_list(self) -> dict[str, Any]:
        """``/v1/models``: ``auto`` (the router), every routable model, every embedding
        model, in OpenAI's list format."""
        names = ["auto", *self.upstreams, *self.embedders]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "canopy"} for name in names]}

    def warm_up(self) -> None:
        """Do once, before the server accepts connections, what the first request would
        otherwise do on the event loop: load the router's compiled kernels (about a second),
        build a region and price a call."""
        scratch = self.config.router()  # never the live router: its state stays untouched
        scratch.scores("warm-up")
        scratch.update("warm-up", scratch.models[0], 0.5, 0.0)
        body = {"messages": [{"role": "user", "content": "warm up"}]}
        try:
            self.service.region(None, body)  # reads the live tree, adds nothing to it
        except Exception as error:  # a user classifier's failure shows on real requests
            log.warning("warm-up: the region classifier failed: %s",
                        redact(repr(error), self.secrets))
        self.config.prices.cost(scratch.models[0], *expected_tokens(body))
        for pool in self.upstreams.values():
            pool.warm_up(body)

    # -- feedback (through :func:`~canopy.apps.routing.proxy.web.rating_route`) ---------
    def feedback(self, request_id: str, quality: Any) -> dict[str, Any]:
        """Rate one call. Runs in a worker thread (the store is never waited on in the
        event loop)."""
        call = self.service.rate(request_id, quality)
        return {"ok": True, "request_id": request_id, "region": call.region,
                "model": call.model, "reward": self.service.reward(call.quality, call.cost)}

    def episode_feedback(self, episode: str, reward: Any) -> dict[str, Any]:
        """An episode's terminal reward, credited as the quality of every call of the
        episode not yet rated (paper Appendix E: each (region, model) pull of the episode
        gets the episode's outcome). Runs in a worker thread."""
        calls = self.service.rate_episode(episode, reward)
        return {"ok": True, "episode_id": episode, "credited": len(calls),
                "calls": [{"request_id": c.id, "region": c.region, "model": c.model}
                          for c in calls]}

    def stats(self) -> JSONResponse | dict[str, Any]:
        """The router's statistics (runs in a worker thread: it reads the store's counts)."""
        try:
            counts = self.service.counts()
        except StoreBusy as error:
            return refused(error)
        return {"models": list(self.service.models), "lam": self.service.lam,
                "learner": self.config.learner, "sharing": self.config.sharing,
                "price_table": self.config.prices.version, "ejected": self.service.ejected(),
                **counts, "statistics": self.service.estimates()}

    async def start(self) -> None:
        """Start the replica pools' health probes and event subscribers; a replica down at
        start is logged (once) and left to the probe."""
        for pool in self.upstreams.values():
            await pool.start()
            if pool.fleet:
                answers = await asyncio.gather(*(pool.answers(r) for r in range(len(pool.up))))
                for replica, up in enumerate(answers):
                    if not up:
                        pool.mark_down(replica)

    async def close(self) -> None:
        for upstream in (*self.upstreams.values(), *self.embedders.values()):
            await upstream.aclose()
        await asyncio.to_thread(self.service.close)


class _ProxyApp(FastAPI):
    """The proxy's FastAPI app with a lean path for its hot routes: a ``POST`` to a path of
    ``lean`` is answered by its handler straight from the server's ASGI call, without
    FastAPI's routing, dependency solving and middleware stack (the same handler, the same
    answers; about half the proxy's own time per chat). Everything else is FastAPI's. Under
    ``canopy serve router`` (uvicorn with the httptools protocol of
    :mod:`~canopy.apps.routing.proxy.connections`) the same routes are answered by the
    protocol itself (``lean_routes``), without an ASGI call at all."""

    lean: dict[str, Callable[[Request], Awaitable[Response]]]
    lean_routes: LeanRoutes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handler = self.lean.get(scope.get("path", "")) if scope["type"] == "http" and \
            scope["method"] == "POST" else None
        if handler is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        answer = await _or_500(handler(Request(scope, receive)), scope["path"])
        await answer(scope, receive, send)


async def _or_500(handling: Awaitable[Response], path: str) -> Response:
    """What Starlette's error middleware would do when a handler fails: log, answer 500."""
    try:
        return await handling
    except Exception:
        log.exception("the proxy failed on %s", path)
        return _error(500, "internal error", "server_error")


def create_app(config: ProxyConfig, *, insecure_no_auth: bool = False,
               prior: Outcomes | None = None) -> FastAPI:
    """The FastAPI application of the proxy. Refuses (``ValueError``) to build without API
    keys unless ``insecure_no_auth``. ``prior``: a log the router is warm-started from
    (``canopy serve router --prior LOG``, ``RegionalRouter.fit``), kept in memory under
    the stored ratings, so a restart never counts it twice; every process sharing a store
    takes the same log."""
    keys = Keys.from_env(config.auth.client_key_env, config.auth.admin_key_env,
                         insecure_no_auth=insecure_no_auth)
    proxy = _Proxy(config, keys, prior)
    limit = config.limits.max_body_bytes

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        proxy.warm_up()  # uvicorn accepts connections only after this
        await proxy.start()
        yield
        await proxy.close()

    async def answered(headers: Any, body: Any, problem: Response | None, endpoint: str,
                       started: float, *, lean: bool = False) -> Response:
        """The chat's answer; its bookkeeping (``after``, then the metrics) done now, or, on
        the lean path, set as the answer's ``after``: once it is written."""
        answer = problem or await proxy.chat(headers, body, endpoint)
        # the answer's status and headers, not the answer: an answer holding a callable
        # that holds it would be a reference cycle, left to the collector with its body
        settle = functools.partial(_settled, answer.status_code, answer.raw_headers,
                                   getattr(answer, "after", None), time.perf_counter() - started)
        if lean and isinstance(answer, JSONAnswer):
            answer.after = settle
        else:
            settle()
        return answer

    def _settled(status: int, raw_headers: list[tuple[bytes, bytes]],
                 after: Callable[[], None] | None, seconds: float) -> None:
        if after is not None:
            after()
        model = next((value.decode("latin-1") for name, value in raw_headers
                      if name == b"x-canopy-model"), None)  # no Headers object made
        proxy.metrics.chat(status, model, seconds)

    async def routed(request: Request, endpoint: str) -> Any:
        started = time.perf_counter()
        body, problem = await read_json(request, keys, admin=False, limit=limit)
        return await answered(request.headers, body, problem, endpoint, started)

    async def lean(raw_headers: list[tuple[bytes, bytes]], raw: bytes | None, *,
                   endpoint: str) -> Response:
        """A chat as the server's protocol hands it over (:class:`LeanRoutes`)."""
        started = time.perf_counter()
        headers = RawHeaders(raw_headers)
        body, problem = checked_json(keys, headers, raw, admin=False, limit=limit)
        return await _or_500(answered(headers, body, problem, endpoint, started, lean=True),
                             f"/v1/{endpoint}")

    app = _ProxyApp(title="Canopy routing proxy", lifespan=lifespan)
    app.state.proxy = proxy
    app.lean = {"/v1/chat/completions": functools.partial(routed, endpoint="chat/completions"),
                "/v1/completions": functools.partial(routed, endpoint="completions")}
    app.lean_routes = LeanRoutes({f"/v1/{endpoint}".encode(): functools.partial(
        lean, endpoint=endpoint) for endpoint in ("chat/completions", "completions")}, limit)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await routed(request, "chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await routed(request, "completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        body, problem = await read_json(request, keys, admin=False, limit=limit)
        return problem or await proxy.embeddings(body)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        return refusal(keys, request, admin=False) or proxy.model_list()

    for path, kind, key, value_key, rate in (
            ("/v1/feedback", "request", "request_id", "quality", proxy.feedback),
            ("/v1/feedback/episode", "episode", "episode_id", "reward",
             proxy.episode_feedback)):
        rating_route(app, path, rate, keys=keys, limit=limit, key=key, value_key=value_key,
                     answered=functools.partial(proxy.metrics.rated, kind))

    @app.get("/metrics")
    async def metrics(request: Request) -> Any:
        refused_key = refusal(keys, request, admin=True)
        if refused_key is not None:
            return refused_key
        for pool in proxy.upstreams.values():
            pool.report()
        return Response(proxy.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/router/stats")
    async def stats(request: Request) -> Any:
        refused_key = refusal(keys, request, admin=True)
        if refused_key is not None:
            return refused_key
        return await run_in_threadpool(proxy.stats)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": list(config.models)}

    return app


def read_prior(path: str | os.PathLike[str]) -> Outcomes:
    """A warm-start log: the long format ``query_id,region,model,quality,cost`` (.csv or
    .jsonl, :func:`canopy.apps.routing.logs.read_long`)."""
    from canopy.apps.routing.logs import read_long

    return read_long(Path(path))


def app_from_env() -> FastAPI:
    """The app of a worker process of ``canopy serve router --workers N``."""
    prior = os.environ.get(PRIOR_ENV)
    return create_app(ProxyConfig.from_file(os.environ[CONFIG_ENV]),
                      insecure_no_auth=bool(os.environ.get(INSECURE_ENV)),
                      prior=read_prior(prior) if prior else None)


@contextlib.contextmanager
def serve_in_thread(app: Any, *, host: str = "127.0.0.1", port: int = 0,
                    startup_timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a background thread, with the connection limits of
    ``canopy serve router`` (:mod:`~canopy.apps.routing.proxy.connections`; the default
    :class:`Limits` for an app that is not the proxy); yields its base URL."""
    import socket

    import uvicorn

    from canopy.apps.routing.proxy.connections import uvicorn_config

    if port == 0:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    proxy = getattr(app.state, "proxy", None)  # None: another app (e.g. a ratings route)
    limits, upstreams = (Limits(), 0) if proxy is None else (proxy.config.limits,
                                                             len(proxy.upstreams))
    server = uvicorn.Server(uvicorn_config(app, limits, upstreams=upstreams, host=host,
                                           port=port))
    thread = threading.Thread(target=server.run, daemon=True, name=f"canopy-router-{port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the routing proxy did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
