"""Where a request's region comes from, bounded (shared by the proxy and the LiteLLM
strategy): a given path (a header or request metadata), else the first matching rule, else a
user classifier, else the nearest centroid of example texts, else the default. A region
outside the allowlist, or new once the tree holds ``max_regions`` nodes, becomes its nearest
known ancestor, so no client can grow the table without bound."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from canopy.apps.routing.proxy.config import RegionConfig
from canopy.apps.routing.proxy.embed import NearestCentroid
from canopy.apps.routing.proxy.guard import user_text
from canopy.regional.regions import RegionTree, normalize_region

__all__ = ["RegionSource", "load_classifier"]


def load_classifier(spec: str) -> Callable[[dict[str, Any]], str]:
    """The function named ``package.module:function`` (it maps a chat body to a region)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"classifier must be 'package.module:function', got {spec!r}")
    function = getattr(importlib.import_module(module), name)
    if not callable(function):
        raise TypeError(f"classifier {spec!r} is not callable")
    return function


class RegionSource:
    """The region of a chat request under a :class:`RegionConfig`."""

    def __init__(self, config: RegionConfig, *, max_regions: int) -> None:
        self.config = config
        self.max_regions = max_regions
        self.classifier = load_classifier(config.classifier) if config.classifier else None
        self.centroids = NearestCentroid(config.centroids) if config.centroids else None
        self.allowed = {normalize_region(a) for a in config.allowed}

    def _raw(self, given: str | None, body: dict[str, Any]) -> str:
        if given:
            return given
        text = user_text(body)
        for pattern, region in self.config.rules:
            if pattern.search(text):
                return region
        if self.classifier is not None:
            region = self.classifier(body)
            if not isinstance(region, str):
                raise TypeError(f"the region classifier returned {region!r}, not a string")
            return region
        if self.centroids is not None:
            return self.centroids.region(text)
        return self.config.default

    def region(self, given: str | None, body: dict[str, Any], tree: RegionTree) -> str:
        """The bounded region: ``ValueError`` for a malformed path; outside the allowlist, or
        new past ``max_regions`` nodes of ``tree``, its nearest known ancestor."""
        path = normalize_region(self._raw(given, body))
        if self.allowed:
            parts = path.split("/")
            return next(("/".join(parts[:end]) for end in range(len(parts), 0, -1)
                         if "/".join(parts[:end]) in self.allowed),
                        normalize_region(self.config.default))
        if path in tree:
            return path
        missing = sum(1 for end in range(1, path.count("/") + 2)
                      if "/".join(path.split("/")[:end]) not in tree)
        if tree.n_nodes + missing > self.max_regions:
            return tree.path(tree.nearest(path))
        return path
