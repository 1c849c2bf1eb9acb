"""The store a URL names (:mod:`canopy.regional.store`): ``memory``, SQLite or Redis. Apart
from the protocol, so that the stores import the protocol and nothing imports back."""

from __future__ import annotations

from urllib.parse import urlsplit

from canopy.regional.store import Store

__all__ = ["open_store"]


def open_store(url: str, *, namespace: str = "", wait_s: float = 1.0) -> Store:
    """The store a URL names: ``"memory"``, ``"sqlite:///path"`` (four slashes for an
    absolute path; or a plain path) or ``"redis://host:port/db"``. ``namespace`` separates
    the statistics of several services in one store; ``wait_s`` bounds how long one
    operation waits for a busy store."""
    if not isinstance(url, str):
        raise TypeError(f"store must be a URL string, got {type(url).__name__}")
    if not url:
        raise ValueError("store must be 'memory', 'sqlite:///path' or 'redis://host:port/db', "
                         "got ''")
    scheme = urlsplit(url).scheme
    if url == "memory":
        from canopy.regional.store_memory import MemoryStore

        return MemoryStore(namespace=namespace)
    if scheme in ("redis", "rediss", "unix"):
        from canopy.regional.store_redis import RedisStore

        return RedisStore(url, namespace=namespace, wait_s=wait_s)
    if scheme == "sqlite":
        url = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if not url:
            raise ValueError("a SQLite store is 'sqlite:///relative/path' or "
                             "'sqlite:////absolute/path'")
    elif scheme:
        raise ValueError(f"unknown store scheme {scheme!r} in {url!r}: use 'memory', "
                         "'sqlite:///path' or 'redis://host:port/db'")
    from canopy.regional.store_sqlite import SqliteStore

    return SqliteStore(url, namespace=namespace, wait_s=wait_s)
