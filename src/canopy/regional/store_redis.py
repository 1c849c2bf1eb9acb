"""The routing service's store in Redis (:mod:`canopy.regional.store`): one store for many
worker processes on many machines (``redis-py``, part of the ``serve`` extra).

Keys under ``canopy:<namespace>:``: ``call:<id>`` (a hash per call, expiring with the
feedback window), ``calls`` and ``rated`` (ids by creation time), ``episode:<id>``,
``cells`` (the sums, three fields per region and model), ``changed`` (cells by the version
that last wrote them), ``marked`` (the ids each rating marked, by its version, those of the
last ``rated_kept`` versions), ``version``, ``meta`` and ``generation`` (the marker a
restart without persistence loses). A rating is one Lua script, so Redis runs it atomically:
the marker is checked, every call is checked and marked and every cell added, or nothing; so
is a re-seed. Every operation waits at most ``wait_s`` (then
:class:`~canopy.regional.store.StoreBusy`); how durable an acknowledged rating is follows the
server's persistence settings (``appendonly yes`` with ``appendfsync always`` or ``everysec``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from canopy.regional.store import (
    RATED_KEPT,
    Call,
    Cell,
    Changes,
    Increment,
    StoreBusy,
    StoreReset,
    StoreUnreachable,
    new_marker,
)

__all__ = ["RedisStore"]

_SEP = "\x1f"
# A new version; the cost_max of ARGV[m] kept if larger; the cells of ARGV[c] (how many),
# then four ARGV each (name, n, s, q) from ARGV[c + 1], added at that version.
_ADD = """
local version = redis.call('INCR', p .. 'version')
local old = tonumber(redis.call('HGET', p .. 'meta', 'cost_max') or '0')
if tonumber(ARGV[m]) > old then redis.call('HSET', p .. 'meta', 'cost_max', ARGV[m]) end
for j = 0, tonumber(ARGV[c]) - 1 do
  local b = c + 1 + 4 * j
  local cell = ARGV[b]
  redis.call('HINCRBYFLOAT', p .. 'cells', cell .. '\\31n', ARGV[b + 1])
  redis.call('HINCRBYFLOAT', p .. 'cells', cell .. '\\31s', ARGV[b + 2])
  redis.call('HINCRBYFLOAT', p .. 'cells', cell .. '\\31q', ARGV[b + 3])
  redis.call('ZADD', p .. 'changed', version, cell)
end
"""
# A rating: ARGV = namespace prefix, generation, k, k ids, quality, cost_max, cells (as
# above), and last how many versions back ``marked`` keeps the ids rated.
_RATE = """
local p, k = ARGV[1], tonumber(ARGV[3])
if redis.call('GET', p .. 'generation') ~= ARGV[2] then return -1 end
for i = 1, k do
  local key = p .. 'call:' .. ARGV[3 + i]
  if redis.call('EXISTS', key) == 0 or redis.call('HEXISTS', key, 'quality') == 1 then
    return 0
  end
end
local at = 4 + k
for i = 1, k do
  local key = p .. 'call:' .. ARGV[3 + i]
  redis.call('HSET', key, 'quality', ARGV[at])
  redis.call('ZADD', p .. 'rated', redis.call('HGET', key, 'created'), ARGV[3 + i])
end
local m, c = at + 1, at + 2
""" + _ADD + """
for i = 1, k do redis.call('ZADD', p .. 'marked', version, ARGV[3 + i]) end
redis.call('ZREMRANGEBYSCORE', p .. 'marked', '-inf', version - tonumber(ARGV[#ARGV]))
return version
"""
_RESEED = """
local p = ARGV[1]
local now = redis.call('GET', p .. 'generation')
if now and string.sub(now, 1, 7) == 'seeded:' then return now end
redis.call('SET', p .. 'generation', ARGV[2])
local m, c = 3, 4
""" + _ADD + """
return ARGV[2]
"""


class RedisStore:
    """A Redis server as the store; safe across threads, processes and machines.
    ``rated_kept``: how many versions back the ids marked rated are kept."""

    rated_kept = RATED_KEPT

    def __init__(self, url: str, *, namespace: str = "", wait_s: float = 1.0) -> None:
        try:
            import redis
        except ImportError:  # pragma: no cover - the serve extra installs it
            raise ImportError("a Redis store needs redis-py: pip install "
                              "'canopy-bandits[serve]'") from None
        self._errors = (redis.RedisError, OSError)
        self._unreachable = (redis.ConnectionError, redis.TimeoutError, OSError)
        self.url = url
        self.namespace = namespace
        self._p = f"canopy:{namespace}:"
        self.generation: str | None = None
        self._redis = redis.Redis.from_url(url, socket_timeout=wait_s,
                                           socket_connect_timeout=wait_s,
                                           decode_responses=True)
        with self._busy():
            self._rate = self._redis.register_script(_RATE)
            self._reseed = self._redis.register_script(_RESEED)
            self._redis.ping()

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        try:
            yield
        except self._errors as error:
            kind = StoreUnreachable if isinstance(error, self._unreachable) else StoreBusy
            raise kind(f"Redis store: {type(error).__name__}: {error}") from error

    def check_meta(self, models: Sequence[str], lam: float) -> None:
        with self._busy():
            self._redis.hsetnx(self._p + "meta", "lam", repr(float(lam)))
            saved = float(self._redis.hget(self._p + "meta", "lam"))
            if saved != float(lam):
                raise ValueError(f"the Redis store holds statistics for lam={saved}, not {lam}")
            self._redis.hset(self._p + "meta", "models", "\n".join(models))
            self._redis.set(self._p + "generation", new_marker(False), nx=True)
            self.generation = self._marker()

    def _marker(self) -> str | None:
        marker = self._redis.get(self._p + "generation")
        return None if marker is None else str(marker)

    def _check(self, marker: str | None) -> None:
        if marker != self.generation:
            raise StoreReset(f"Redis store {self.url}: generation {marker}, not "
                             f"{self.generation} (restarted empty or flushed)")

    def reseed(self, cells: Sequence[Cell], cost_max: float) -> bool:
        mine = new_marker(True)
        args: list[str] = [self._p, mine, repr(float(cost_max)), str(len(cells))]
        for c in cells:
            args += [c.region + _SEP + c.model, repr(c.n), repr(c.s), repr(c.q)]
        with self._busy():
            self.generation = str(self._reseed(args=args))
        return self.generation == mine

    def ping(self) -> None:
        with self._busy():
            self._redis.ping()

    def add_calls(self, calls: Sequence[Call], ttl_s: float) -> None:
        ttl = max(int(ttl_s) + 1, 1)
        with self._busy(), self._redis.pipeline(transaction=False) as pipe:
            for c in calls:
                key = self._p + "call:" + c.id
                fields = {"region": c.region, "model": c.model, "cost": repr(c.cost),
                          "created": repr(c.created)}
                if c.episode is not None:
                    fields["episode"] = c.episode
                    pipe.zadd(self._p + "episode:" + c.episode, {c.id: c.created})
                    pipe.expire(self._p + "episode:" + c.episode, ttl)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, ttl)
                pipe.zadd(self._p + "calls", {c.id: c.created})
            pipe.execute()

    def calls(self, ids: Sequence[str]) -> list[Call | None]:
        with self._busy(), self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._p + "generation")
            for one in ids:
                pipe.hgetall(self._p + "call:" + one)
            marker, *rows = pipe.execute()
        self._check(marker)
        return [_call(one, row) for one, row in zip(ids, rows, strict=True)]

    def episode(self, episode: str) -> list[Call]:
        with self._busy():
            ids = self._redis.zrange(self._p + "episode:" + episode, 0, -1)
        return [c for c in self.calls(ids) if c is not None]

    def rate(self, ids: Sequence[str], quality: float, increments: Sequence[Increment],
             cost_max: float) -> bool:
        args: list[str] = [self._p, str(self.generation), str(len(ids)), *ids,
                           repr(float(quality)),
                           repr(float(cost_max)), str(len(increments))]
        for i in increments:
            args += [i.region + _SEP + i.model, repr(i.weight), repr(i.weight * i.reward),
                     repr(i.weight * i.reward * i.reward)]
        args.append(str(self.rated_kept))
        with self._busy():
            version = int(self._rate(args=args))
        if version < 0:
            raise StoreReset(f"Redis store {self.url}: its generation is not {self.generation}")
        return version > 0

    def changes(self, since: int) -> Changes:
        with self._busy():
            self._check(self._marker())
            version = int(self._redis.get(self._p + "version") or 0)
            names = self._redis.zrangebyscore(self._p + "changed", f"({since}", "+inf")
            fields = [f"{name}{_SEP}{part}" for name in names for part in "nsq"]
            values = self._redis.hmget(self._p + "cells", fields) if fields else []
            cost_max = float(self._redis.hget(self._p + "meta", "cost_max") or 0.0)
        cells = []
        for i, name in enumerate(names):
            region, _, model = name.partition(_SEP)
            n, s, q = (float(v or 0.0) for v in values[3 * i:3 * i + 3])
            cells.append(Cell(region, model, n, s, q))
        return Changes(version, tuple(cells), cost_max)

    def rated_since(self, version: int) -> list[str] | None:
        with self._busy(), self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._p + "generation")
            pipe.get(self._p + "version")
            pipe.zrangebyscore(self._p + "marked", f"({version}", "+inf")
            marker, now, ids = pipe.execute()
        self._check(marker)
        return None if version < int(now or 0) - self.rated_kept else list(ids)

    def expire(self, older_than: float) -> int:
        with self._busy():
            old = self._redis.zrangebyscore(self._p + "calls", "-inf", f"({older_than}")
            if not old:
                return 0
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(*(self._p + "call:" + one for one in old))
                pipe.zrem(self._p + "calls", *old)
                pipe.zrem(self._p + "rated", *old)
                pipe.execute()
        return len(old)

    def counts(self) -> dict[str, int]:
        with self._busy():
            return {"requests": int(self._redis.zcard(self._p + "calls")),
                    "with_feedback": int(self._redis.zcard(self._p + "rated"))}

    def namespaces(self, prefix: str) -> dict[str, list[str]]:
        out = {}
        with self._busy():
            for key in self._redis.scan_iter(match=f"canopy:{_glob(prefix)}*:meta", count=500):
                models = self._redis.hget(key, "models")
                if models is not None:
                    out[key[len("canopy:"):-len(":meta")]] = models.split("\n")
        return out

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
            self._redis.close()


def _call(ident: str, row: dict[str, str]) -> Call | None:
    if not row or "model" not in row:
        return None
    quality = row.get("quality")
    return Call(ident, row["region"], row["model"], float(row["cost"]), float(row["created"]),
                row.get("episode"), None if quality is None else float(quality))


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
