"""Configuration of the routing proxy, read from a JSON file::

    {
      "upstreams": [
        {"model": "small", "base_url": "http://127.0.0.1:8001/v1",
         "upstream_model": "smollm2-135m", "api_key_env": null, "timeout_s": 10},
        {"model": "fleet", "replicas": ["http://127.0.0.1:8002/v1",
                                        {"url": "http://127.0.0.1:8003/v1",
                                         "events_endpoint": "tcp://127.0.0.1:5557",
                                         "events_topic": "kv", "replay_endpoint": null,
                                         "block_size": 16, "tokenizer": null}],
         "replica_policy": "canopy",    # canopy.fleet.make_policy's names
         "replica_options": {"overhead_tokens": 200},   # and its keyword options
         "index": {"mode": "approximate", "block_size": 16, "tokenizer": null,
                   "ttl_s": 180, "max_event_bytes": 4194304},
         "allow_remote_events": false}  # the gateway's replicas (docs/fleet.md, "Gateway")
      ],
      "lam": 100.0,                      # reward = quality - lam * cost (dollars)
      "learner": "ucb", "sharing": "test", "delta": 0.01, "kappa": 5.0, "explore": 1.0,
      "store": "sqlite:///router.sqlite",  # or "redis://host:6379/0" or "memory";
                                         # "state_path": "router.sqlite" is the SQLite
                                         # shorthand (relative paths: from the file)
      "deadline_s": 30.0,                # per request, over every upstream tried
      "prices": null,                    # a price-table JSON; null: the shipped table
      "auth": {"client_key_env": "CANOPY_CLIENT_KEY",      # chat
               "admin_key_env": "CANOPY_ADMIN_KEY"},       # feedback, stats
      "limits": {"max_body_bytes": 1048576, "max_regions": 1024,
                 "feedback_window_s": 604800, "breaker_failures": 3, "breaker_cooldown_s": 30,
                 "store_wait_s": 0.5},
      "region": {"header": "X-Canopy-Region", "default": "",
                 "allowed": ["code", "code/python", "chat"],   # optional allowlist
                 "rules": [{"pattern": "(?i)\\bdef |python", "region": "code"}],  # optional
                 "classifier": "package.module:function",   # optional
                 "centroids": {"code": ["write a python function", ...]}}  # optional
    }

Every upstream's ``model`` must have a price (a model is never priced at zero). The keys
themselves never appear in the file: ``auth`` names the environment variables that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canopy import safeio
from canopy._lazy import deprecated_aliases
from canopy.apps.routing.prices import PriceTable
from canopy.regional import sources
from canopy.regional.router import RegionalRouter
from canopy.validation import check_count, check_positive

__all__ = ["AuthConfig", "Limits", "ProxyConfig", "Replica", "Upstream"]


INDEX_KEYS = frozenset({"mode", "block_size", "tokenizer", "ttl_s", "max_event_bytes"})
POLICY_OPTIONS = frozenset({"cache_threshold", "balance_abs", "balance_rel", "dynamo_weight",
                            "theta", "overhead_tokens", "explore"})
"""The keyword options of :func:`canopy.fleet.make_policy` an upstream's
``replica_options`` may set."""


@dataclass(frozen=True)
class Replica:
    """One replica of a model: its URL and, for a ``precise`` index, where its KV events
    arrive (``events_endpoint``, bound by the gateway; ``events_topic``; vLLM's
    ``replay_endpoint``); ``block_size`` and ``tokenizer`` override the upstream's
    ``index`` settings."""

    url: str
    events_endpoint: str | None = None
    events_topic: str = ""
    replay_endpoint: str | None = None
    block_size: int | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"a replica URL must be http(s), got {self.url!r}")
        if self.block_size is not None:
            check_count(self.block_size, "block_size")

    @classmethod
    def from_entry(cls, entry: Any) -> Replica:
        """A replica from its config entry: a URL, or an object with ``url``."""
        if isinstance(entry, str):
            return cls(entry)
        if not isinstance(entry, dict):
            raise ValueError(f"a replica is a URL or an object with 'url', got {entry!r}")
        try:
            return cls(**entry)
        except TypeError as error:
            raise ValueError(f"bad replica entry: {error}") from None


@dataclass(frozen=True)
class Upstream:
    """One model behind the proxy: one ``base_url``, or several ``replicas`` among which
    ``replica_policy`` (a name of :func:`canopy.fleet.make_policy`) chooses per request,
    with the options ``replica_options`` (:data:`POLICY_OPTIONS`; for ``canopy``,
    ``overhead_tokens``: the engine's per-request TTFT overhead over its time a prompt token),
    with a replica index set by ``index`` (``mode``: ``precise`` from KV events or
    ``approximate``; ``block_size``; ``tokenizer``; ``ttl_s``; ``max_event_bytes``)."""

    model: str
    base_url: str = ""
    upstream_model: str = ""
    api_key_env: str | None = None
    timeout_s: float = 30.0
    replicas: tuple[Replica, ...] = ()
    replica_policy: str = "round_robin"
    replica_options: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    allow_remote_events: bool = False

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("an upstream needs a model name")
        replicas = tuple(r if isinstance(r, Replica) else Replica.from_entry(r)
                         for r in self.replicas)
        urls = [r.url for r in replicas]
        if not replicas:
            if not self.base_url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {self.model!r}: base_url must be http(s), "
                                 f"got {self.base_url!r}")
            replicas = (Replica(self.base_url),)
        elif self.base_url and self.base_url not in urls:
            raise ValueError(f"upstream {self.model!r}: base_url {self.base_url!r} is not "
                             "one of its replicas")
        if len(set(urls)) != len(urls):
            raise ValueError(f"upstream {self.model!r}: replica URLs repeat")
        object.__setattr__(self, "replicas", replicas)
        object.__setattr__(self, "base_url", replicas[0].url)
        from canopy.fleet.policies import NAMES

        if self.replica_policy not in NAMES:
            raise ValueError(f"upstream {self.model!r}: unknown replica policy "
                             f"{self.replica_policy!r}; known: {', '.join(NAMES)}")
        if not isinstance(self.replica_options, dict) or \
                set(self.replica_options) - POLICY_OPTIONS:
            raise ValueError(f"upstream {self.model!r}: 'replica_options' takes the keys "
                             f"{sorted(POLICY_OPTIONS)}")
        if not isinstance(self.index, dict) or set(self.index) - INDEX_KEYS:
            raise ValueError(f"upstream {self.model!r}: 'index' takes the keys "
                             f"{sorted(INDEX_KEYS)}")
        mode = self.index.get("mode", "approximate")
        if mode not in ("precise", "approximate"):
            raise ValueError(f"upstream {self.model!r}: index mode must be 'precise' or "
                             f"'approximate', got {mode!r}")
        if mode == "precise" and any(r.events_endpoint is None for r in replicas):
            raise ValueError(f"upstream {self.model!r}: a precise index needs every "
                             "replica's events_endpoint")
        object.__setattr__(self, "timeout_s", check_positive(self.timeout_s, "timeout_s"))
        if not self.upstream_model:
            object.__setattr__(self, "upstream_model", self.model)


@dataclass(frozen=True)
class AuthConfig:
    """Names of the environment variables holding the client key (chat) and the admin key
    (feedback, statistics). Both unset: the proxy refuses to start unless told it may run
    without authentication."""

    client_key_env: str | None = None
    admin_key_env: str | None = None

    @classmethod
    def from_mapping(cls, data: Any) -> AuthConfig:
        if not isinstance(data, dict) or set(data) - {"client_key_env", "admin_key_env"}:
            raise ValueError("'auth' must be {'client_key_env': NAME, 'admin_key_env': NAME}")
        for key, value in data.items():
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"auth.{key} must name an environment variable")
        return cls(**data)


@dataclass(frozen=True)
class Limits:
    """What a client can make the proxy hold: body size, distinct regions, how long a request
    id accepts feedback, open connections, how long a client may take to send a request,
    header size, idle keep-alive, an upstream answer's size; the circuit breaker (failures in
    a row, cool-down); and how long a chat or a rating waits for a busy store (then the chat
    is answered anyway and its call stored later; the rating gets 503)."""

    max_body_bytes: int = 1 << 20
    max_regions: int = 1024
    feedback_window_s: float = 7 * 24 * 3600.0
    breaker_failures: int = 3
    breaker_cooldown_s: float = 30.0
    store_wait_s: float = 0.5
    max_connections: int = 1024
    client_timeout_s: float = 10.0
    max_header_bytes: int = 16384
    keep_alive_s: float = 5.0
    max_answer_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_regions", "breaker_failures", "max_connections",
                     "max_header_bytes", "max_answer_bytes"):
            check_count(getattr(self, name), f"limits.{name}")
        for name in ("feedback_window_s", "breaker_cooldown_s", "store_wait_s",
                     "client_timeout_s", "keep_alive_s"):
            object.__setattr__(self, name, check_positive(getattr(self, name), f"limits.{name}"))


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the proxy needs; validated on construction."""

    upstreams: tuple[Upstream, ...]
    store: str
    lam: float = 0.0
    learner: str = "ucb"
    sharing: str = "test"
    delta: float = 0.01
    kappa: float = 5.0
    explore: float = 1.0
    deadline_s: float = 30.0
    prices: PriceTable = field(default_factory=PriceTable.default)
    region: sources.RegionConfig = field(default_factory=sources.RegionConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: Limits = field(default_factory=Limits)
    embeddings: tuple[Upstream, ...] = ()

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("the proxy needs at least one upstream")
        names = [u.model for u in self.upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream model names repeat: {names}")
        both = [u.model for u in self.embeddings]
        if len(set(names + both)) != len(names + both) or {"auto", ""} & set(names + both):
            raise ValueError(f"model names must be unique across upstreams and embeddings, "
                             f"and not 'auto': {names + both}")
        for name in names:
            self.prices.price(name)  # KeyError for an unpriced model
        object.__setattr__(self, "deadline_s", check_positive(self.deadline_s, "deadline_s"))
        self.router()  # lam, learner, sharing, delta, kappa, explore: refused now, not later

    @property
    def state_path(self) -> Path | None:
        """The SQLite file of the store, if it is one."""
        if self.store == "memory" or self.store.startswith(("redis://", "rediss://", "unix:")):
            return None
        return Path(self.store.removeprefix("sqlite:///"))

    def router(self) -> RegionalRouter:
        """A fresh router with this configuration's settings."""
        return RegionalRouter(self.models, lam=self.lam, learner=self.learner,
                              sharing=self.sharing, delta=self.delta, kappa=self.kappa,
                              explore=self.explore, seed=0)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(u.model for u in self.upstreams)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, base: Path = Path()) -> ProxyConfig:
        """From parsed JSON; relative paths are taken from ``base``."""
        if not isinstance(data, dict):
            raise TypeError("the proxy configuration must be a JSON object")
        known = {"upstreams", "store", "state_path", "lam", "learner", "sharing", "delta", "kappa",
                 "explore", "deadline_s", "prices", "region", "auth", "limits", "embeddings"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown configuration keys: {sorted(unknown)}")
        try:
            upstreams = tuple(Upstream(**u) for u in data["upstreams"])
            embeddings = tuple(Upstream(**u) for u in data.get("embeddings", []))
        except KeyError as missing:
            raise ValueError(f"configuration lacks {missing}") from None
        except TypeError as error:
            raise ValueError(f"bad upstream entry: {error}") from None
        store = _store_url(data, base)
        try:
            limits = Limits(**data.get("limits", {}))
        except TypeError as error:
            raise ValueError(f"bad limits: {error}") from None
        prices = data.get("prices")
        table = PriceTable.default() if prices is None else (
            PriceTable.from_mapping(prices) if isinstance(prices, dict)
            else PriceTable.from_file(base / prices))
        options = {k: data[k] for k in ("lam", "learner", "sharing", "delta", "kappa",
                                        "explore", "deadline_s") if k in data}
        return cls(upstreams, store, prices=table,
                   region=sources.RegionConfig.from_mapping(data.get("region", {})),
                   auth=AuthConfig.from_mapping(data.get("auth", {})), limits=limits,
                   embeddings=embeddings, **options)

    @classmethod
    def from_file(cls, path: str | Path) -> ProxyConfig:
        path = Path(path)
        text = safeio.read_text(path, max_bytes=safeio.MiB, what="router configuration")
        data = safeio.parse_json(text, file=path)
        return cls.from_mapping(data, base=path.parent)


def _store_url(data: dict[str, Any], base: Path) -> str:
    """The store a configuration names (``store``, or ``state_path`` as SQLite shorthand),
    with a relative SQLite path taken from ``base``."""
    if ("store" in data) == ("state_path" in data):
        raise ValueError("the configuration needs one of 'store' ('sqlite:///path', "
                         "'redis://host:port/db' or 'memory') and 'state_path'")
    store = data.get("store")
    if store is None:
        store = data["state_path"]
        if not isinstance(store, str) or not store:
            raise ValueError(f"state_path must be a file path, got {store!r}")
    elif not isinstance(store, str) or not (store == "memory" or store.startswith(
            ("sqlite:///", "redis://", "rediss://", "unix:"))):
        raise ValueError(f"store must be 'sqlite:///path', 'redis://host:port/db' or "
                         f"'memory', got {store!r}")
    if store == "memory" or not (store.startswith("sqlite:///") or "://" not in store):
        return store
    path = Path(store.removeprefix("sqlite:///"))
    return f"sqlite:///{path if path.is_absolute() else base / path}"


deprecated_aliases(__name__, {"RegionConfig": "canopy.regional.sources"})
