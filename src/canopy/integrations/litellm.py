"""Canopy's regional router as a LiteLLM routing strategy (the ``litellm`` extra).

A LiteLLM ``Router`` user adds three lines::

    from canopy.integrations.litellm import CanopyRouting

    canopy = CanopyRouting(router, lam=100.0).install()   # picks deployments from now on
    reply = await router.acompletion(model="chat", messages=messages,
                                     metadata={"canopy_region": "code/python"})
    await canopy.afeedback(reply.id, quality=0.9)         # when the quality is known

Within a model group the arms are the group's deployments (``model_info.id``) and the reward
is ``quality - lam * cost`` (paper Section 5, "Routing"). LiteLLM's success and failure
callbacks feed the cost (``response_cost``, from the deployment's prices) and latency back;
quality arrives through :meth:`CanopyRouting.feedback`, with the proxy's rules (one rating per
reply, in [0, 1], within ``feedback_window_s``), or at once as ``success_quality`` when the
caller has no quality signal. A failed call is credited ``failure_quality``. The region comes
from the request's ``metadata["canopy_region"]``, else the proxy's region rules, classifier
or centroids (:class:`~canopy.apps.routing.proxy.config.RegionConfig`), bounded the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

from canopy.apps.routing.proxy.config import RegionConfig
from canopy.apps.routing.proxy.regions import RegionSource
from canopy.regional.router import RegionalRouter
from canopy.validation import check_count, check_nonnegative, check_number

__all__ = ["CanopyRouting", "UnknownReply"]

REGION_KEY = "canopy_region"
_RESOLVED_KEY = "canopy_region_resolved"
_STRATEGY_KEY = "canopy_strategy"
log = logging.getLogger("canopy.litellm")


class UnknownReply(KeyError):
    """Feedback for a reply this strategy did not route, already rated, or expired."""


@dataclass
class _Pending:
    group: str
    region: str
    deployment: str
    cost: float
    at: float
    rated: bool = False


def _deployments(router: Any, group: str) -> list[Mapping[str, Any]]:
    registry = getattr(router, "registry", None)
    if registry is not None:  # litellm >= 1.110
        return list(registry().deployments(group))
    return list(router.get_model_list(model_name=group) or [])


def _deployment_id(deployment: Mapping[str, Any]) -> str:
    return str((deployment.get("model_info") or {}).get("id", ""))


def _metadata(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    params = kwargs.get("litellm_params") or {}
    return params.get("metadata") or kwargs.get("metadata") or {}


def _priced(kwargs: Mapping[str, Any], cost: Any) -> bool:
    """Whether ``cost`` is a real price: LiteLLM reports 0 for a model it cannot price, so
    zero counts only when the deployment declares its prices."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or \
            not math.isfinite(cost) or cost < 0:
        return False
    info = (kwargs.get("litellm_params") or {}).get("model_info") or {}
    return cost > 0 or "input_cost_per_token" in info or "output_cost_per_token" in info


class CanopyRouting(CustomRoutingStrategyBase):
    """Pick each call's deployment with a :class:`~canopy.regional.RegionalRouter` per model
    group; learn from LiteLLM's callbacks and :meth:`feedback`.

    ``lam`` prices cost in quality units per dollar, ``latency_price`` (dollars per second,
    default 0) adds latency to the cost; ``learner``, ``sharing``, ``delta``, ``kappa``,
    ``explore`` are the router's. ``region`` is a :class:`RegionConfig` or its JSON mapping;
    at most ``max_regions`` regions are grown, and at most ``max_pending`` replies await a
    rating (the oldest go first)."""

    def __init__(self, router: Any, *, lam: float = 0.0, learner: str = "ucb",
                 sharing: str = "test", delta: float = 0.01, kappa: float = 5.0,
                 explore: float = 1.0, region: RegionConfig | Mapping[str, Any] | None = None,
                 max_regions: int = 1024, success_quality: float | None = None,
                 failure_quality: float = 0.0, latency_price: float = 0.0,
                 feedback_window_s: float = 3600.0, max_pending: int = 100_000) -> None:
        self.router = router
        self._settings = {"lam": lam, "learner": learner, "sharing": sharing, "delta": delta,
                          "kappa": kappa, "explore": explore}
        RegionalRouter(["check"], **self._settings)  # bad settings are refused now
        config = region if isinstance(region, RegionConfig) else \
            RegionConfig.from_mapping(dict(region or {}))
        self.regions = RegionSource(config, max_regions=check_count(max_regions, "max_regions"))
        self.success_quality = None if success_quality is None else \
            check_number(success_quality, "success_quality", low=0.0, high=1.0)
        self.failure_quality = check_number(failure_quality, "failure_quality", low=0.0,
                                            high=1.0)
        self.latency_price = check_nonnegative(latency_price, "latency_price")
        self.window_s = check_nonnegative(feedback_window_s, "feedback_window_s")
        self.max_pending = check_count(max_pending, "max_pending")
        self.routers: dict[str, RegionalRouter] = {}
        self.counts = {"routed": 0, "succeeded": 0, "failed": 0, "rated": 0, "unpriced": 0}
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex

    def install(self) -> CanopyRouting:
        """Make this strategy pick the router's deployments and receive LiteLLM's callbacks."""
        import litellm

        register = getattr(self.router, "register_plugin", None) or \
            self.router.set_custom_routing_strategy
        register(self)
        _CALLBACK.strategies[self._token] = self
        if _CALLBACK not in litellm.callbacks:
            litellm.callbacks.append(_CALLBACK)
        return self

    # -- routing ---------------------------------------------------------------------------
    def _router_for(self, group: str, ids: list[str]) -> RegionalRouter:
        router = self.routers.get(group)
        if router is None or set(router.models) != set(ids):
            if router is not None:
                log.warning("model group %r changed deployments; its statistics restart", group)
            router = self.routers[group] = RegionalRouter(ids, seed=0, **self._settings)
        return router

    def _pick(self, model: str, messages: list[dict[str, Any]] | None,
              request_kwargs: dict[str, Any] | None) -> Mapping[str, Any]:
        deployments = {_deployment_id(d): d for d in _deployments(self.router, model)}
        if not deployments:
            raise ValueError(f"no deployment serves model group {model!r}")
        metadata = (request_kwargs or {}).setdefault("metadata", {}) \
            if request_kwargs is not None else {}
        given = metadata.get(REGION_KEY)
        with self._lock:
            router = self._router_for(model, sorted(deployments))
            region = self.regions.region(given if isinstance(given, str) else None,
                                         {"messages": messages or []}, router.regions)
            choice = router.route(region)
            self.counts["routed"] += 1
        metadata[_RESOLVED_KEY], metadata[_STRATEGY_KEY] = region, self._token
        return deployments[choice]

    async def async_get_available_deployment(
            self, model: str, messages: list[dict[str, Any]] | None = None,
            input: str | list[object] | None = None, specific_deployment: bool | None = False,
            request_kwargs: dict[str, Any] | None = None) -> Mapping[str, Any]:
        """The deployment of group ``model`` the regional router picks for this request."""
        return self._pick(model, messages, request_kwargs)

    def get_available_deployment(
            self, model: str, messages: list[dict[str, Any]] | None = None,
            input: str | list[object] | None = None, specific_deployment: bool | None = False,
            request_kwargs: dict[str, Any] | None = None) -> Mapping[str, Any]:
        """The synchronous pick (``router.completion``)."""
        return self._pick(model, messages, request_kwargs)

    # -- learning --------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if now - oldest.at <= self.window_s and len(self._pending) <= self.max_pending:
                return
            self._pending.popitem(last=False)

    def _learn(self, metadata: Mapping[str, Any], kwargs: Mapping[str, Any], reply: Any,
               seconds: float, ok: bool) -> None:
        region, group = metadata.get(_RESOLVED_KEY), metadata.get("model_group")
        deployment = str(((kwargs.get("litellm_params") or {}).get("model_info") or {})
                         .get("id", ""))
        with self._lock:
            router = self.routers.get(group) if isinstance(group, str) else None
            if router is None or region is None or deployment not in router.models:
                return  # not a call this strategy routed
            extra = self.latency_price * max(seconds, 0.0)
            if not ok:
                self.counts["failed"] += 1
                router.update(region, deployment, self.failure_quality, extra)
                return
            self.counts["succeeded"] += 1
            cost = kwargs.get("response_cost")
            if not _priced(kwargs, cost):
                self.counts["unpriced"] += 1  # never learn from an unknown cost as if free
                log.warning("deployment %r returned no cost: set input_cost_per_token and "
                            "output_cost_per_token in its litellm_params", deployment)
                return
            if self.success_quality is not None:
                router.update(region, deployment, self.success_quality, float(cost) + extra)
                return
            reply_id = getattr(reply, "id", None)
            if isinstance(reply_id, str):
                now = time.monotonic()
                self._pending[reply_id] = _Pending(group, region, deployment,
                                                   float(cost) + extra, now)
                self._expire(now)

    def feedback(self, reply_id: str, quality: float) -> None:
        """Credit ``quality`` in [0, 1] to the call that produced reply ``reply_id``: once
        (:class:`UnknownReply` for a second rating, an unknown or an expired id)."""
        quality = check_number(quality, "quality", low=0.0, high=1.0)
        with self._lock:
            self._expire(time.monotonic())
            pending = self._pending.get(reply_id)
            if pending is None:
                raise UnknownReply(f"unknown or expired reply id {reply_id!r}")
            if pending.rated:
                raise UnknownReply(f"reply {reply_id!r} is already rated")
            self.routers[pending.group].update(pending.region, pending.deployment,
                                               float(quality), pending.cost)
            pending.rated = True
            self.counts["rated"] += 1

    async def afeedback(self, reply_id: str, quality: float, *, wait_s: float = 2.0) -> None:
        """:meth:`feedback` from async code right after the call: LiteLLM runs its success
        callback after returning the reply, so this waits up to ``wait_s`` for it."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.feedback(reply_id, quality)
            except UnknownReply:
                with self._lock:
                    known = reply_id in self._pending
                if known or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.005)

    def deployment_of(self, reply_id: str) -> str:
        """The deployment that produced a reply awaiting (or given) its rating."""
        with self._lock:
            pending = self._pending.get(reply_id)
        if pending is None:
            raise UnknownReply(f"unknown or expired reply id {reply_id!r}")
        return pending.deployment

    def stats(self) -> dict[str, Any]:
        """Counters and, per model group, the router's estimates per region and deployment."""
        with self._lock:
            return {"counts": dict(self.counts), "pending": len(self._pending),
                    "groups": {group: router.estimates()
                               for group, router in self.routers.items()}}


class _Callback(CustomLogger):
    """LiteLLM's success/failure hooks, forwarding cost and latency to the strategy that
    routed the call. One instance serves every strategy: LiteLLM registers a logger class
    once."""

    def __init__(self) -> None:
        super().__init__()
        self.strategies: weakref.WeakValueDictionary[str, CanopyRouting] = \
            weakref.WeakValueDictionary()

    def _forward(self, kwargs: Any, reply: Any, start: Any, end: Any, ok: bool) -> None:
        metadata = _metadata(kwargs)
        strategy = self.strategies.get(metadata.get(_STRATEGY_KEY, ""))
        if strategy is not None:
            strategy._learn(metadata, kwargs, reply, self._seconds(start, end), ok)

    @staticmethod
    def _seconds(start: Any, end: Any) -> float:
        try:
            return float((end - start).total_seconds())
        except (TypeError, AttributeError):
            return 0.0

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                          end_time: Any) -> None:
        self._forward(kwargs, response_obj, start_time, end_time, True)

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                          end_time: Any) -> None:
        self._forward(kwargs, response_obj, start_time, end_time, False)

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                                      end_time: Any) -> None:
        self.log_success_event(kwargs, response_obj, start_time, end_time)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                                      end_time: Any) -> None:
        self.log_failure_event(kwargs, response_obj, start_time, end_time)


_CALLBACK = _Callback()
