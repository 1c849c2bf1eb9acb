"""Configuration of the routing proxy, read from a JSON file::

    {
      "upstreams": [
        {"model": "small", "base_url": "http://127.0.0.1:8001/v1",
         "upstream_model": "smollm2-135m", "api_key_env": null, "timeout_s": 10}
      ],
      "lam": 100.0,                      # reward = quality - lam * cost (dollars)
      "learner": "ucb", "kappa": 5.0, "explore": 1.0,
      "state_path": "router.sqlite",     # learned statistics (relative to the file)
      "deadline_s": 30.0,                # per request, over every upstream tried
      "prices": null,                    # a price-table JSON; null: the shipped table
      "region": {"header": "X-Canopy-Region", "default": "",
                 "classifier": "package.module:function",   # optional
                 "centroids": {"code": ["write a python function", ...]}}  # optional
    }

Every upstream's ``model`` must have a price (a model is never priced at zero).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canopy.apps.routing.prices import PriceTable

__all__ = ["ProxyConfig", "RegionConfig", "Upstream"]


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Upstream:
    """One model behind the proxy."""

    model: str
    base_url: str
    upstream_model: str = ""
    api_key_env: str | None = None
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("an upstream needs a model name")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"upstream {self.model!r}: base_url must be http(s), "
                             f"got {self.base_url!r}")
        object.__setattr__(self, "timeout_s", _positive(self.timeout_s, "timeout_s"))
        if not self.upstream_model:
            object.__setattr__(self, "upstream_model", self.model)


@dataclass(frozen=True)
class RegionConfig:
    """Where a request's region comes from: a header, else a classifier, else the nearest
    centroid of example texts, else ``default``."""

    header: str = "X-Canopy-Region"
    default: str = ""
    classifier: str | None = None
    centroids: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the proxy needs; validated on construction."""

    upstreams: tuple[Upstream, ...]
    state_path: Path
    lam: float = 0.0
    learner: str = "ucb"
    kappa: float = 5.0
    explore: float = 1.0
    deadline_s: float = 30.0
    prices: PriceTable = field(default_factory=PriceTable.default)
    region: RegionConfig = field(default_factory=RegionConfig)

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("the proxy needs at least one upstream")
        names = [u.model for u in self.upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream model names repeat: {names}")
        for name in names:
            self.prices.price(name)  # KeyError for an unpriced model
        object.__setattr__(self, "deadline_s", _positive(self.deadline_s, "deadline_s"))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(u.model for u in self.upstreams)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, base: Path = Path()) -> ProxyConfig:
        """From parsed JSON; relative paths are taken from ``base``."""
        if not isinstance(data, dict):
            raise TypeError("the proxy configuration must be a JSON object")
        known = {"upstreams", "state_path", "lam", "learner", "kappa", "explore", "deadline_s",
                 "prices", "region"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown configuration keys: {sorted(unknown)}")
        try:
            upstreams = tuple(Upstream(**u) for u in data["upstreams"])
            state = Path(data["state_path"])
        except KeyError as missing:
            raise ValueError(f"configuration lacks {missing}") from None
        except TypeError as error:
            raise ValueError(f"bad upstream entry: {error}") from None
        prices = data.get("prices")
        table = PriceTable.default() if prices is None else (
            PriceTable.from_mapping(prices) if isinstance(prices, dict)
            else PriceTable.from_file(base / prices))
        options = {k: data[k] for k in ("lam", "learner", "kappa", "explore", "deadline_s")
                   if k in data}
        return cls(upstreams, state if state.is_absolute() else base / state, prices=table,
                   region=RegionConfig(**data.get("region", {})), **options)

    @classmethod
    def from_file(cls, path: str | Path) -> ProxyConfig:
        path = Path(path)
        with open(path, encoding="utf-8") as handle:
            try:
                data = json.load(handle)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: not JSON ({error})") from None
        return cls.from_mapping(data, base=path.parent)
