"""The upstreams behind the routing proxy, as the proxy calls them. The routing service
chooses a *model* (:meth:`~canopy.regional.service.RoutingService.route`); the proxy then
asks that model's :class:`UpstreamPool` which replica serves the call
(:meth:`UpstreamPool.replica`). Each upstream has one replica today, its ``base_url``: the
method is the place for a per-request choice among several (round robin, least load,
cache-aware), behind the model choice and apart from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from canopy.apps.routing.proxy.config import Upstream
from canopy.llm.passthrough import AsyncPassthrough

__all__ = ["UpstreamPool"]


class UpstreamPool:
    """One model's upstream (:class:`~canopy.apps.routing.proxy.config.Upstream`) and a
    client per replica, each reading answers of at most ``max_answer_bytes``."""

    def __init__(self, config: Upstream, *, max_answer_bytes: int) -> None:
        self.config = config
        self._replicas = (AsyncPassthrough(config.base_url, model=config.upstream_model,
                                           api_key_env=config.api_key_env,
                                           max_answer_bytes=max_answer_bytes),)

    @property
    def timeout_s(self) -> float:
        """The longest one call to this upstream may take (within the request's deadline)."""
        return self.config.timeout_s

    def replica(self, body: Mapping[str, Any]) -> AsyncPassthrough:
        """The client of the replica that serves the request ``body`` (the only one)."""
        return self._replicas[0]

    async def aclose(self) -> None:
        for client in self._replicas:
            await client.aclose()
