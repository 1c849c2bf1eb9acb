"""Where a request's region comes from, bounded (the routing service's
:meth:`~canopy.regional.service.RoutingService.route`, for the proxy and the LiteLLM strategy
alike): a given path (a header or request metadata), else the first matching rule (a regular
expression over the user messages), else a user classifier, else the nearest centroid of
example texts, else the default. A region outside the allowlist, or new once the tree holds
``max_regions`` nodes, becomes its nearest known ancestor, so no client can grow the table
without bound."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from canopy.regional.embed import NearestCentroid
from canopy.regional.regions import RegionTree, normalize_region
from canopy.validation import check_count

__all__ = ["RegionConfig", "RegionSource", "load_classifier", "message_text", "user_text"]


@dataclass(frozen=True)
class RegionConfig:
    """Where a request's region comes from: a header, else the first matching rule (a regular
    expression over the user messages), else a classifier, else the nearest centroid of
    example texts, else ``default``. With ``allowed``, a region outside the list becomes its
    nearest allowed ancestor (or ``default``)."""

    header: str = "X-Canopy-Region"
    default: str = ""
    allowed: tuple[str, ...] = ()
    rules: tuple[tuple[re.Pattern[str], str], ...] = ()
    classifier: str | None = None
    centroids: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Any) -> RegionConfig:
        if not isinstance(data, dict):
            raise ValueError("'region' must be a JSON object")
        unknown = set(data) - {"header", "default", "allowed", "rules", "classifier",
                               "centroids"}
        if unknown:
            raise ValueError(f"unknown region keys: {sorted(unknown)}")
        rules = []
        for number, rule in enumerate(data.get("rules", [])):
            if not isinstance(rule, dict) or set(rule) != {"pattern", "region"} or \
                    not all(isinstance(v, str) for v in rule.values()):
                raise ValueError(f"region.rules[{number}] must be "
                                 "{'pattern': regex, 'region': path}")
            try:
                rules.append((re.compile(rule["pattern"]), rule["region"]))
            except re.error as error:
                raise ValueError(f"region.rules[{number}]: bad pattern ({error})") from None
        allowed = data.get("allowed", [])
        if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
            raise ValueError("region.allowed must be a list of region paths")
        centroids = data.get("centroids", {})
        if not isinstance(centroids, dict):
            raise ValueError("region.centroids must map regions to lists of example texts")
        classifier = data.get("classifier")
        if classifier is not None and not isinstance(classifier, str):
            raise ValueError("region.classifier must be 'package.module:function'")
        return cls(header=str(data.get("header", "X-Canopy-Region")),
                   default=str(data.get("default", "")), allowed=tuple(allowed),
                   rules=tuple(rules), classifier=classifier, centroids=centroids)


def message_text(content: Any) -> str | None:
    """A message's text: a string, a list of parts (``{"type": "text", "text": ...}``; other
    part types count as no text), or ``None`` (an assistant's tool call)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str)
                                         for p in content):
        return "\n".join(p["text"] for p in content
                         if p["type"] == "text" and isinstance(p.get("text"), str))
    raise TypeError(f"a message's content must be a string or a list of parts, got "
                    f"{type(content).__name__}")


def user_text(body: dict[str, Any]) -> str:
    """The text of the user messages (what region rules and centroids read)."""
    return "\n".join(message_text(m.get("content")) or "" for m in body["messages"]
                     if m.get("role") == "user")


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
    """The region of a chat request under a :class:`RegionConfig`, bounded to at most
    ``max_regions`` regions: :meth:`propose` reads the request (a classifier may take its
    time: no lock is needed), :meth:`bound` holds it to a region tree's bounds."""

    def __init__(self, config: RegionConfig | None = None, *, max_regions: int = 1024
                 ) -> None:
        self.config = RegionConfig() if config is None else config
        self.max_regions = check_count(max_regions, "max_regions")
        spec = self.config.classifier
        self.classifier = load_classifier(spec) if spec else None
        self.centroids = NearestCentroid(self.config.centroids) if self.config.centroids \
            else None
        self.allowed = {normalize_region(a) for a in self.config.allowed}

    def propose(self, given: str | None, body: dict[str, Any] | None) -> str:
        """The region path a request asks for (normalised; ``ValueError`` when malformed):
        ``given``, else the rules, the classifier, the centroids over ``body``'s user text,
        else the default."""
        return normalize_region(self._raw(given, body or {"messages": []}))

    def _raw(self, given: str | None, body: dict[str, Any]) -> str:
        if given:
            return given
        if not self.config.rules and self.classifier is None and self.centroids is None:
            return self.config.default  # nothing reads the body
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

    def bound(self, path: str, tree: RegionTree) -> str:
        """``path`` (from :meth:`propose`) within bounds: outside the allowlist, or new past
        ``max_regions`` nodes of ``tree``, its nearest known ancestor."""
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
