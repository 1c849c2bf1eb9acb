"""Canopy's routing service as a LiteLLM routing strategy (the ``litellm`` extra).

A LiteLLM ``Router`` user adds three lines::

    from canopy.integrations.litellm import CanopyRouting

    canopy = CanopyRouting(router, lam=100.0).install()   # picks deployments from now on
    reply = await router.acompletion(model="chat", messages=messages,
                                     metadata={"canopy_region": "code/python"})
    await canopy.afeedback(reply.id, quality=0.9)         # when the quality is known

Within a model group the arms are the group's deployments (``model_info.id``) and the reward
is ``quality - lam * cost`` (paper Section 4, "Routing"). Each group is one
:class:`~canopy.regional.service.RoutingService`, the proxy's: the same feedback ledger (one
rating per reply, in [0, 1], within ``feedback_window_s``), the same circuit breaker, and the
same stores (``store="sqlite:///path"`` keeps what was learned across restarts,
``"redis://host:port/db"`` shares it between LiteLLM instances). Only deployments LiteLLM
itself holds healthy are picked (cooldowns, blocked and failed health checks removed first),
the breaker's ejected ones last. LiteLLM's success and failure callbacks feed the cost
(``response_cost``, from the deployment's prices) and latency back; quality arrives through
:meth:`CanopyRouting.feedback`, or at once as ``success_quality`` when the caller has no
quality signal. A failed call counts against the breaker and is rated ``failure_quality``.
The region comes from the request's ``metadata["canopy_region"]``, else the proxy's region
rules, classifier or centroids (:class:`~canopy.regional.sources.RegionConfig`), bounded the
same way. The strategy decides nothing itself: each pick is the service's
:meth:`~canopy.regional.service.RoutingService.route` among the healthy deployments, each
outcome its :meth:`~canopy.regional.service.RoutingService.outcome`, and a refused rating
raises the ledger's own error (:class:`~canopy.regional.ledger.FeedbackError`: unknown,
already rated, expired, not in [0, 1]), whose type carries the HTTP status and code.

LiteLLM proxy users (``config.yaml``) load :class:`CanopyRouting` as a callback: its
``async_filter_deployments`` hook narrows the healthy deployments LiteLLM hands it to the one
the service picks (see ``docs/routing.md``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, TypeGuard, TypeVar

from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

from canopy._lazy import deprecated_aliases
from canopy.regional.ledger import FeedbackError, UnknownCall
from canopy.regional.router import RegionalRouter
from canopy.regional.service import RoutingService
from canopy.regional.sources import RegionConfig, RegionSource
from canopy.regional.store import Call, Store, StoreBusy
from canopy.regional.stores import open_store
from canopy.validation import check_count, check_nonnegative, check_number

__all__ = ["CanopyRouting"]

REGION_KEY = "canopy_region"
_NAMESPACE = "litellm"  # each model group's statistics live under litellm/<group>
_RESOLVED_KEY = "canopy_region_resolved"
_STRATEGY_KEY = "canopy_strategy"
log = logging.getLogger("canopy.litellm")
_Deployment = TypeVar("_Deployment", bound=Mapping[str, Any])  # one of the model list's


def _deployments(router: Any, group: str) -> list[Mapping[str, Any]]:
    registry = getattr(router, "registry", None)
    if registry is not None:  # litellm >= 1.110
        return list(registry().deployments(group))
    return list(router.get_model_list(model_name=group) or [])


def _deployment_id(deployment: Mapping[str, Any]) -> str:
    return str((deployment.get("model_info") or {}).get("id", ""))


def _metadata(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    params = kwargs.get("litellm_params") or {}
    found = params.get("metadata") or kwargs.get("metadata")
    return found if isinstance(found, dict) else {}


def _writable_metadata(request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The request's metadata dict, created when absent or ``None``."""
    if request_kwargs is None:
        return {}
    metadata = request_kwargs.get("metadata")
    if not isinstance(metadata, dict):
        metadata = request_kwargs["metadata"] = {}
    return metadata


def _priced(cost: Any, kwargs: Mapping[str, Any]) -> TypeGuard[float]:
    """Whether ``cost`` is a real price: LiteLLM reports 0 for a model it cannot price, so
    zero counts only when the deployment declares its prices."""
    try:
        check_nonnegative(cost, "response_cost")
    except (TypeError, ValueError):
        return False
    info = (kwargs.get("litellm_params") or {}).get("model_info") or {}
    return cost > 0 or "input_cost_per_token" in info or "output_cost_per_token" in info


class CanopyRouting(CustomRoutingStrategyBase, CustomLogger):
    """Pick each call's deployment with a :class:`~canopy.regional.service.RoutingService`
    per model group; learn from LiteLLM's callbacks and :meth:`feedback`.

    ``lam`` prices cost in quality units per dollar, ``latency_price`` (dollars per second,
    default 0) adds latency to the cost; ``learner``, ``sharing``, ``delta``, ``kappa``,
    ``explore`` are the router's. ``store`` is where the statistics and pending replies live
    (``"memory"``, ``"sqlite:///path"``, ``"redis://host:port/db"``); ``breaker_failures``
    failures in a row set a deployment aside for ``breaker_cooldown_s``. ``region`` is a
    :class:`RegionConfig` or its JSON mapping; at most ``max_regions`` regions are grown, and
    at most ``max_pending`` replies wait for the store. ``router`` may be ``None`` when the
    strategy runs only as a LiteLLM proxy callback."""

    def __init__(self, router: Any = None, *, lam: float = 0.0, learner: str = "ucb",
                 sharing: str = "test", delta: float = 0.01, kappa: float = 5.0,
                 explore: float = 1.0, region: RegionConfig | Mapping[str, Any] | None = None,
                 max_regions: int = 1024, success_quality: float | None = None,
                 failure_quality: float = 0.0, latency_price: float = 0.0,
                 feedback_window_s: float = 3600.0, max_pending: int = 100_000,
                 store: str = "memory", breaker_failures: int = 3,
                 breaker_cooldown_s: float = 30.0) -> None:
        CustomLogger.__init__(self)
        self.router = router
        self._settings: dict[str, Any] = {"lam": lam, "learner": learner, "sharing": sharing,
                                          "delta": delta, "kappa": kappa, "explore": explore}
        RegionalRouter(["check"], **self._settings)  # bad settings are refused now
        config = region if isinstance(region, RegionConfig) else \
            RegionConfig.from_mapping(dict(region or {}))
        self.regions = RegionSource(config, max_regions=check_count(max_regions, "max_regions"))
        self.success_quality = None if success_quality is None else \
            check_number(success_quality, "success_quality", low=0.0, high=1.0)
        self.failure_quality = check_number(failure_quality, "failure_quality", low=0.0,
                                            high=1.0)
        self.latency_price = check_nonnegative(latency_price, "latency_price")
        self._service_options: dict[str, Any] = {
            "window_s": check_nonnegative(feedback_window_s, "feedback_window_s"),
            "max_queued": check_count(max_pending, "max_pending"),
            "breaker_failures": check_count(breaker_failures, "breaker_failures"),
            "breaker_cooldown_s": check_nonnegative(breaker_cooldown_s, "breaker_cooldown_s")}
        self.store = store
        self._catalog = open_store(store, namespace=_NAMESPACE)  # a bad store is refused now
        self.services: dict[str, RoutingService] = {}
        self._stores: dict[str, Store] = {}  # each group's, kept across its services
        self.counts = {"routed": 0, "succeeded": 0, "failed": 0, "rated": 0, "unpriced": 0}
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex
        import litellm

        _CALLBACK.strategies[self._token] = self  # outcomes of the calls this one routes
        if _CALLBACK not in litellm.callbacks:
            litellm.callbacks.append(_CALLBACK)

    def install(self) -> CanopyRouting:
        """Make this strategy pick the router's deployments."""
        register = getattr(self.router, "register_plugin", None) or \
            self.router.set_custom_routing_strategy
        register(self)
        return self

    # -- routing ---------------------------------------------------------------------------
    def _service(self, group: str, ids: list[str]) -> RoutingService:
        """The group's service (over the shared store, its own namespace); rebuilt, from the
        store, when the group gains a deployment (one that leaves is simply never offered)."""
        with self._lock:
            service = self.services.get(group)
            if service is not None and set(ids) <= set(service.models):
                return service
            if service is not None:
                log.info("model group %r gained deployments; its service reloads", group)
                ids = sorted(set(ids) | set(service.models))
                service.close(store=False)
            store = self._stores.get(group)
            if store is None:
                store = self._stores[group] = open_store(self.store,
                                                         namespace=f"{_NAMESPACE}/{group}")
            service = self.services[group] = RoutingService(
                RegionalRouter(sorted(ids), seed=0, **self._settings), store,
                regions=self.regions, **self._service_options)
            return service

    def _choose(self, group: str, every: list[Mapping[str, Any]],
                healthy: list[_Deployment], messages: list[dict[str, Any]] | None,
                request_kwargs: dict[str, Any] | None) -> _Deployment:
        """The best-ranked of ``healthy`` (the breaker's ejected ones last), learning over
        every deployment of the group."""
        by_id = {_deployment_id(d): d for d in healthy}
        if not by_id:
            raise ValueError(f"no deployment serves model group {group!r}")
        service = self._service(group, sorted({_deployment_id(d) for d in every} | set(by_id)))
        metadata = _writable_metadata(request_kwargs)
        given = metadata.get(REGION_KEY)
        region, ranking = service.route(given if isinstance(given, str) else None,
                                        {"messages": messages or []}, allowed=by_id)
        with self._lock:
            self.counts["routed"] += 1
        metadata[_RESOLVED_KEY], metadata[_STRATEGY_KEY] = region, self._token
        return by_id[ranking[0]]

    def _usable(self, group: str, deployments: list[Mapping[str, Any]]
                ) -> list[Mapping[str, Any]]:
        """``deployments`` less those LiteLLM has cooling down or blocked (synchronous)."""
        health = getattr(self.router, "health", None)
        if health is None:
            return deployments
        state = health()
        cooling = {one for one, _ in state.cooldowns.get_active_cooldowns(
            [_deployment_id(d) for d in deployments], None)}
        return [d for d in deployments
                if _deployment_id(d) not in cooling and not state.is_blocked(d)]

    async def async_get_available_deployment(
            self, model: str, messages: list[dict[str, Any]] | None = None,
            input: str | list[object] | None = None, specific_deployment: bool | None = False,
            request_kwargs: dict[str, Any] | None = None) -> Mapping[str, Any]:
        """The deployment of group ``model`` the service picks among those LiteLLM holds
        healthy (its cooldowns, blocks, health checks and pre-call checks applied)."""
        every = _deployments(self.router, model)
        select = getattr(self.router, "select", None)
        if select is None or not every:
            healthy = self._usable(model, every)
        else:
            healthy = list(await select(model, dict(request_kwargs or {}), kind="healthy",
                                        messages=messages, input=input))
        return self._choose(model, every, healthy, messages, request_kwargs)

    def get_available_deployment(
            self, model: str, messages: list[dict[str, Any]] | None = None,
            input: str | list[object] | None = None, specific_deployment: bool | None = False,
            request_kwargs: dict[str, Any] | None = None) -> Mapping[str, Any]:
        """The synchronous pick (``router.completion``): cooldowns and blocks applied."""
        every = _deployments(self.router, model)
        return self._choose(model, every, self._usable(model, every), messages,
                            request_kwargs)

    async def async_filter_deployments(self, model: str, healthy_deployments: list,
                                       messages: list | None,
                                       request_kwargs: dict | None = None,
                                       parent_otel_span: Any = None) -> list[dict]:
        """LiteLLM's routing-callback hook (how a LiteLLM *proxy* loads this strategy from
        its ``config.yaml``): keep only the service's pick among the healthy deployments."""
        if not healthy_deployments:
            return healthy_deployments
        if request_kwargs is not None and not isinstance(request_kwargs.get("metadata"), dict):
            found = request_kwargs.get("litellm_metadata")
            if isinstance(found, dict):
                request_kwargs["metadata"] = found
        return [self._choose(model, healthy_deployments, healthy_deployments, messages,
                             request_kwargs)]

    # -- LiteLLM's outcome callbacks, when LiteLLM holds this object as a callback -----------
    def _heard(self, kwargs: Any, reply: Any, start: Any, end: Any, ok: bool) -> None:
        """A LiteLLM proxy rebuilds its callback list from its configuration, so the shared
        listener may be missing there: then this object hears the outcomes itself."""
        import litellm

        if _CALLBACK not in litellm.callbacks:
            _CALLBACK._forward(kwargs, reply, start, end, ok)

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                                      end_time: Any) -> None:
        self._heard(kwargs, response_obj, start_time, end_time, True)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                                      end_time: Any) -> None:
        self._heard(kwargs, response_obj, start_time, end_time, False)

    # -- learning --------------------------------------------------------------------------
    def _learn(self, metadata: Mapping[str, Any], kwargs: Mapping[str, Any], reply: Any,
               seconds: float, ok: bool) -> None:
        region, group = metadata.get(_RESOLVED_KEY), metadata.get("model_group")
        deployment = str(((kwargs.get("litellm_params") or {}).get("model_info") or {})
                         .get("id", ""))
        service = self.services.get(group) if isinstance(group, str) else None
        if service is None or not isinstance(region, str) or deployment not in service.models:
            return  # not a call this strategy routed
        extra = self.latency_price * max(seconds, 0.0)
        if not ok:
            with self._lock:
                self.counts["failed"] += 1
            service.outcome(deployment, ok=False)
            self._rate_now(service, region, deployment, extra, self.failure_quality)
            return
        service.outcome(deployment, ok=True)
        with self._lock:
            self.counts["succeeded"] += 1
        cost = kwargs.get("response_cost")
        price = float(cost) + extra if _priced(cost, kwargs) else None
        if price is None:
            with self._lock:
                self.counts["unpriced"] += 1  # never learn from an unknown cost as if free
            log.warning("deployment %r returned no cost: set input_cost_per_token and "
                        "output_cost_per_token in its litellm_params", deployment)
            return
        if self.success_quality is not None:
            self._rate_now(service, region, deployment, price, self.success_quality)
            return
        reply_id = getattr(reply, "id", None)
        if isinstance(reply_id, str):
            service.record(Call(reply_id, region, deployment, price, time.time()))

    def _rate_now(self, service: RoutingService, region: str, deployment: str, cost: float,
                  quality: float) -> None:
        """A call rated as it ends (a failure, or ``success_quality``): stored in the
        background, never waited on in LiteLLM's callback."""
        call = Call(f"auto-{uuid.uuid4().hex}", region, deployment, cost, time.time())

        def rate(_: Any) -> None:
            try:
                service.rate(call.id, quality)
            except (FeedbackError, StoreBusy) as error:
                log.warning("a %s call's rating was not stored: %s", deployment, error)

        service.record(call).add_done_callback(rate)

    def _groups(self) -> list[RoutingService]:
        """Every model group's service: those this process routed, and those the store holds
        (routed by another process sharing it), opened on first need."""
        with self._lock:
            known = set(self.services)
        found = self._catalog.namespaces(_NAMESPACE + "/")
        for namespace, models in found.items():
            group = namespace[len(_NAMESPACE) + 1:]
            if group not in known:
                self._service(group, models)
        with self._lock:
            return list(self.services.values())

    def _find(self, reply_id: str) -> tuple[RoutingService, Call]:
        """The group's service holding the reply's call, and the call; ``UnknownCall``."""
        for service in self._groups():
            call = service.call(reply_id)
            if call is not None:
                return service, call
        raise UnknownCall(f"unknown request id {reply_id!r}")

    def feedback(self, reply_id: str, quality: float) -> Call:
        """Credit ``quality`` in [0, 1] to the call that produced reply ``reply_id``, once;
        the call, rated. A refusal is the ledger's
        :class:`~canopy.regional.ledger.FeedbackError`: ``UnknownCall`` (an id never routed,
        or forgotten), ``AlreadyRated``, ``FeedbackExpired``, ``InvalidRating`` (also a
        ``TypeError`` or ``ValueError``). Waits at most the store's wait; raises
        ``StoreBusy`` when the store is busy (retry later)."""
        service, _ = self._find(reply_id)
        call = service.rate(reply_id, quality)
        with self._lock:
            self.counts["rated"] += 1
        return call

    async def afeedback(self, reply_id: str, quality: float, *, wait_s: float = 2.0
                        ) -> Call:
        """:meth:`feedback` from async code right after the call (in a thread: the store is
        never waited on in the event loop). LiteLLM runs its success callback after returning
        the reply, so an unknown reply or a busy store is retried for up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return await asyncio.to_thread(self.feedback, reply_id, quality)
            except (UnknownCall, StoreBusy):
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.005)

    def deployment_of(self, reply_id: str) -> str:
        """The deployment that produced a reply awaiting (or given) its rating."""
        return self._find(reply_id)[1].model

    def stats(self) -> dict[str, Any]:
        """Counters and, per model group, the service's estimates per region and
        deployment."""
        with self._lock:
            counts = dict(self.counts)
            services = dict(self.services)
        return {"counts": counts,
                "pending": sum(s.counts()["requests"] - s.counts()["with_feedback"]
                               for s in services.values()),
                "groups": {group: service.estimates() for group, service in services.items()}}

    def close(self) -> None:
        """Stop every group's service (storing what is queued)."""
        with self._lock:
            services, self.services, self._stores = list(self.services.values()), {}, {}
        for service in services:
            service.close()
        self._catalog.close()


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


deprecated_aliases(__name__, {"UnknownReply": "canopy.regional.ledger:FeedbackError"})
