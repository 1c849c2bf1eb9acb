"""The fleet simulator's compiled replay: N replicas, each a prefix cache evicting in vLLM's
LRU order and serving prefills one at a time in arrival order (decode overlapped: it holds
blocks and counts as in flight, but takes no prefill time), a TTFT of wait + overhead +
prefill of the uncached tokens; or, batched (vLLM's continuous batching), in steps: a
step prefills together every request that waited for it, in ``overhead + ms_per_token x``
the batch's uncached tokens, and the requests that arrive during a step join the next one
(a request's TTFT: the rest of the running step, then its own); with ``cores`` (either
way) the replicas share that many replicas' worth of compute (``k`` stepping at once each run at
``min(1, cores / k)``: engines on shared cores, where every cached token saves all of them
time). A gateway that routes each request by a replica policy
(:func:`canopy.fleet.policies.decide`) over its replica index and load table, which the
replicas' events and first tokens keep current (:mod:`canopy.fleet.index`,
:mod:`canopy.fleet.load`). Events (first token, finish) wait in a binary heap and are
delivered when the clock passes them: the index is precise at once (KV events with no lag),
the load and the learner's feedback arrive with the first token.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from canopy.fleet import load as load_module
from canopy.fleet.index import calibrate_ttl, match_nodes, send_nodes
from canopy.fleet.policies import decide, hash_key, learn
from canopy.prefix.kernels import CACHED, canopy_request
from canopy.regional import kernels

__all__ = ["ORACLE", "advance_steps", "held_canopy", "held_lru", "lru_state", "replay",
           "serve_canopy", "serve_lru"]

ORACLE = -1
"""Policy code of the reference that sees the true caches and queues (no gateway has it)."""


@nb.njit(cache=True, inline="always")
def _heap_push(hkey, hval, n, key, val):
    i = n
    hkey[i] = key
    hval[i] = val
    while i > 0:
        p = (i - 1) >> 1
        if hkey[p] <= hkey[i]:
            break
        hkey[p], hkey[i] = hkey[i], hkey[p]
        hval[p], hval[i] = hval[i], hval[p]
        i = p
    return n + 1


@nb.njit(cache=True, inline="always")
def _heap_pop(hkey, hval, n):
    n -= 1
    hkey[0], hval[0] = hkey[n], hval[n]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= n:
            break
        b = a + 1
        c = b if b < n and hkey[b] < hkey[a] else a
        if hkey[i] <= hkey[c]:
            break
        hkey[c], hkey[i] = hkey[i], hkey[c]
        hval[c], hval[i] = hval[i], hval[c]
        i = c
    return n


@nb.njit(cache=True)
def _lru(prev, nxt, cached, ends, path, capacity, pin, tag, mask, bit, events):
    """Replica's LRU cache serves ``path`` (root first): returns the blocks it already held
    (its prefix before the first miss). The path's blocks are touched leaf first, so the
    root is the most recent and a parent never leaves before its child (vLLM appends a
    finished request's blocks to its free queue tail first). With ``events``, the index's
    ``mask`` follows every store and eviction (``BlockStored``/``BlockRemoved``)."""
    n = path.size
    k = 0
    while k < n and cached[path[k]]:
        k += 1
    for j in range(n):
        pin[path[j]] = tag
    head, tail, size = ends[0], ends[1], ends[2]
    need = size + (n - k) - capacity
    moved = 0
    while need > 0 and tail >= 0 and moved <= size:
        v = tail  # the list runs from tail (oldest) to head (newest) through nxt
        tail = nxt[v]
        if tail >= 0:
            prev[tail] = -1
        else:
            head = -1
        nxt[v] = -1
        if pin[v] == tag:  # a block of this request: it is touched below anyway
            moved += 1
            prev[v] = -1
            nxt[v] = -1
            if head >= 0:
                nxt[head] = v
                prev[v] = head
            else:
                tail = v
            head = v
            continue
        cached[v] = 0
        size -= 1
        need -= 1
        if events:
            mask[v] &= ~bit
    for j in range(n - 1, -1, -1):
        v = path[j]
        if cached[v]:  # unlink
            p, q = prev[v], nxt[v]
            if q >= 0:
                prev[q] = p
            else:
                head = p
            if p >= 0:
                nxt[p] = q
            else:
                tail = q
        elif size < capacity:
            cached[v] = 1
            size += 1
            if events:
                mask[v] |= bit
        else:
            continue  # no room (every block pinned): not cached
        prev[v] = head
        nxt[v] = -1
        if head >= 0:
            nxt[head] = v
        else:
            tail = v
        head = v
    ends[0], ends[1], ends[2] = head, tail, size
    return k


@nb.njit(cache=True)
def serve_lru(state, r, i, lo, hi, path, capacity, mask, bit):
    """The LRU replicas (``state``: their lists, flags, ends, pins): serve request ``i`` on
    replica ``r``, emitting the index's events into ``mask``."""
    prev, nxt, cached, ends, pin = state
    return _lru(prev[r], nxt[r], cached[r], ends[r], path, capacity, pin, i, mask, bit, True)


@nb.njit(cache=True)
def held_lru(state, r, path, out_r):
    """Blocks of ``path`` replica ``r`` holds before its first miss (its own flags)."""
    cached = state[2]
    k = 0
    while k < path.size and cached[r, path[k]]:
        k += 1
    return k


@nb.njit(cache=True)
def serve_canopy(state, r, i, lo, hi, path, capacity, mask, bit):
    """Replicas evicting by Canopy's policy (``state``: the trace's tables, the policy's
    parameters, per replica its cells, cache and shadows;
    :func:`~canopy.prefix.kernels.canopy_request`). It emits no events: the precise index reads
    the replicas' tables."""
    nodes, parent, depth, params, cells, caches, shadows = state
    return canopy_request(i, lo, hi, nodes, parent, depth, capacity, params, cells[r],
                          caches[r], shadows[r])


@nb.njit(cache=True)
def held_canopy(state, r, path, out_r):
    ni = state[5][r].ni
    k = 0
    while k < path.size and ni[path[k], CACHED] == 1:
        k += 1
    return k


def lru_state(n_rep: int, n_nodes: int) -> tuple:
    """Empty LRU replicas for :func:`serve_lru`."""
    ends = np.empty((n_rep, 3), dtype=np.int64)
    ends[:, :2] = -1
    ends[:, 2] = 0
    return (np.full((n_rep, n_nodes), -1, dtype=np.int32),
            np.full((n_rep, n_nodes), -1, dtype=np.int32),
            np.zeros((n_rep, n_nodes), dtype=np.uint8), ends,
            np.full(n_nodes, -1, dtype=np.int64))


@nb.njit(cache=True)
def _next_step(r, cur, left, head, tail, link, work, queued, max_batch, overhead_s,
               per_token_s, busy_out):
    """Replica ``r`` starts its next step on the first ``max_batch`` requests of its queue
    (``head[r]``..``tail[r]`` through ``link``; ``work[i]``: request ``i``'s uncached
    tokens), or goes idle (``cur[r]`` -1) when none waits."""
    cur[r] = head[r]
    left[r] = 0.0
    if head[r] < 0:
        return
    tokens = 0.0
    j, last, taken = head[r], -1, 0
    while j >= 0 and taken < max_batch:
        tokens += work[j]
        last, j = j, link[j]
        taken += 1
    link[last] = -1
    head[r] = j
    if j < 0:
        tail[r] = -1
    queued[r, 0] -= taken
    queued[r, 1] -= tokens
    left[r] = overhead_s + per_token_s * tokens
    busy_out[r] += left[r]


@nb.njit(cache=True)
def advance_steps(until, clock, left, cur, head, tail, link, work, queued, max_batch,
                  arrival, out_tokens, overhead_s, per_token_s, tpot_s, cores, ttft_out,
                  busy_out, hkey, hval, hlen):
    """Replicas prefilling in steps, from ``clock[0]`` to ``until`` (s): each running step
    (replica ``r``'s requests linked from ``cur[r]`` through ``link``, ``left[r]`` seconds
    of work at full speed) progresses at ``min(1, cores / k)`` with ``k`` steps running; a
    step that ends gives its requests their first token (TTFT written, first-token and
    finish events pushed) and the replica starts its next step on up to ``max_batch``
    waiting requests (``_next_step``; ``queued[r]``: their count and uncached tokens).
    Returns the heap's length."""
    n_rep = left.size
    while True:
        k = 0
        first = -1
        for r in range(n_rep):
            if cur[r] >= 0:
                k += 1
                if first < 0 or left[r] < left[first]:
                    first = r
        if k == 0:
            clock[0] = max(clock[0], until)
            return hlen
        rate = min(1.0, cores / k)
        dt = max(left[first], 0.0) / rate
        if clock[0] + dt > until:
            for r in range(n_rep):
                if cur[r] >= 0:
                    left[r] -= (until - clock[0]) * rate
            clock[0] = until
            return hlen
        clock[0] += dt
        for r in range(n_rep):
            if cur[r] >= 0:
                left[r] -= dt * rate
        t = clock[0]
        j = cur[first]
        while j >= 0:
            ttft_out[j] = t - arrival[j]
            hlen = _heap_push(hkey, hval, hlen, t, 2 * j)
            hlen = _heap_push(hkey, hval, hlen, t + out_tokens[j] * tpot_s, 2 * j + 1)
            j = link[j]
        _next_step(first, cur, left, head, tail, link, work, queued, max_batch, overhead_s,
                   per_token_s, busy_out)


@nb.njit(cache=True)
def replay(serve, held, replicas, events, offsets, nodes, n_nodes, tokens, out_tokens,
           arrival, block_tokens, n_rep,
           capacity, ms_per_token, overhead_ms, tpot_ms, code, params, state, approximate,
           ttl, calibrate, learning, stats, chains, region_of, rule, cost_max, grid, explore,
           max_batch, cores, ttft_out, hit_out, replica_out, theta_out, busy_out):
    """Replay the trace (request ``i``: ``nodes[offsets[i]:offsets[i + 1]]`` arriving at
    ``arrival[i]`` s) through ``n_rep`` replicas of ``capacity`` blocks under policy
    ``code`` (:data:`ORACLE`: the true minimum TTFT). The replicas' caches are
    ``replicas``, served by ``serve`` (:func:`serve_lru`, :func:`serve_canopy`); with
    ``events`` they feed the precise index, else it reads their tables (``held``). Writes
    per request its TTFT (s), blocks hit, replica and trade-off (``learning``: the arm's
    ``theta``), per replica its busy time (s); returns the approximate index's final TTL.
    ``max_batch`` above 0: the replicas prefill in steps of up to that many requests
    (:func:`advance_steps`; 1 serves them one at a time), sharing ``cores`` replicas' worth
    of compute (``inf``: each its own); 0: one at a time, each replica on its own."""
    n = offsets.size - 1
    mask = np.zeros(n_nodes, dtype=np.uint64)
    stamp = np.full(n_nodes if approximate else 0, -np.inf, dtype=np.float64)
    no_stamp = np.empty(0, dtype=np.float64)
    no_mask = np.zeros(n_nodes, dtype=np.uint64)  # where the events of an approximate run go
    table = np.zeros((len(load_module.FIELDS), n_rep))
    free_at = np.zeros(n_rep)
    hkey = np.empty(2 * n)
    hval = np.empty(2 * n, dtype=np.int64)
    hlen = 0
    matched = np.zeros(n_rep, dtype=np.int64)
    scratch = np.zeros(n_rep)
    predicted = np.zeros(n, dtype=np.int64)
    estimate = np.zeros(n)
    arm_of = np.zeros(n, dtype=np.int64)
    k_arms = grid.size
    est = np.empty((k_arms, 3))
    index = np.empty(k_arms)
    z = np.zeros(k_arms)
    clock = np.zeros(1)
    left = np.zeros(n_rep)
    cur = np.full(n_rep, -1, dtype=np.int64)
    head = np.full(n_rep, -1, dtype=np.int64)
    tail = np.full(n_rep, -1, dtype=np.int64)
    queued = np.zeros((n_rep, 2))
    work = np.zeros(n)
    link = np.full(n, -1, dtype=np.int64)
    overhead_s, per_token_s, tpot_s = overhead_ms / 1000.0, ms_per_token / 1000.0, \
        tpot_ms / 1000.0
    for i in range(n):
        now = arrival[i]
        if max_batch > 0:
            hlen = advance_steps(now, clock, left, cur, head, tail, link, work, queued,
                                 max_batch, arrival, out_tokens, overhead_s, per_token_s,
                                 tpot_s, cores, ttft_out, busy_out, hkey, hval, hlen)
        while hlen > 0 and hkey[0] <= now:
            ev = hval[0]
            hlen = _heap_pop(hkey, hval, hlen)
            j = ev >> 1
            r = replica_out[j]
            if ev & 1 == 0:  # first token
                load_module.first_token(table, r, estimate[j], ttft_out[j])
                if learning:
                    learn(stats, chains[region_of[j]], arm_of[j], ttft_out[j], rule, cost_max)
                if approximate and calibrate:
                    ttl = calibrate_ttl(ttl, predicted[j], hit_out[j])
            else:
                blocks = (tokens[j] + out_tokens[j] + block_tokens - 1) // block_tokens
                load_module.finished(table, r, blocks, capacity)
        path = nodes[offsets[i]:offsets[i + 1]]
        req_tokens = tokens[i]
        if approximate:
            match_nodes(mask, stamp, path, now, ttl, matched)
        elif events:
            match_nodes(mask, no_stamp, path, now, np.inf, matched)
        else:
            for r in range(n_rep):
                matched[r] = held(replicas, r, path, 0)
        if code == ORACLE:
            state[0] += 1
            for r in range(n_rep):
                cached_tokens = min(matched[r] * block_tokens, req_tokens)
                scratch[r] = max(free_at[r] - now, 0.0) + (
                    overhead_ms + ms_per_token * (req_tokens - cached_tokens)) / 1000.0
                if max_batch > 0 and cur[r] >= 0:  # the running step, then the queue's
                    steps = 1.0 if max_batch > 1 else queued[r, 0] + 1.0
                    scratch[r] = left[r] + (overhead_ms * steps + ms_per_token * (
                        queued[r, 1] + req_tokens - cached_tokens)) / 1000.0
            best = state[0] % n_rep
            for s in range(1, n_rep):
                r = (state[0] + s) % n_rep
                if scratch[r] < scratch[best]:
                    best = r
            r = best
        else:
            if learning:
                kernels.scores(stats, chains[region_of[i]], kernels.UCB, rule, explore, z,
                               est, index)
                arm = 0
                for a in range(1, k_arms):
                    if index[a] > index[arm]:
                        arm = a
                arm_of[i] = arm
                params[0] = grid[arm]
            r = decide(code, params, state, matched, path.size, req_tokens, block_tokens,
                       hash_key(path), table, scratch)
        theta_out[i] = params[0]
        predicted[i] = matched[r]
        bit = np.uint64(1) << np.uint64(r)
        if approximate:  # the replicas' events do not reach an approximate index
            hit = serve(replicas, r, i, offsets[i], offsets[i + 1], path, capacity, no_mask,
                        bit)
        else:
            hit = serve(replicas, r, i, offsets[i], offsets[i + 1], path, capacity, mask, bit)
        if approximate:
            send_nodes(mask, stamp, path, r, now, ttl)
        hit_out[i] = hit
        uncached = req_tokens - min(hit * block_tokens, req_tokens)
        replica_out[i] = r
        estimate[i] = req_tokens - min(matched[r] * block_tokens, req_tokens)
        blocks = (req_tokens + out_tokens[i] + block_tokens - 1) // block_tokens
        load_module.routed(table, r, estimate[i], blocks, capacity)
        if max_batch > 0:  # queued; an idle replica starts a step on it now
            work[i] = uncached
            if tail[r] >= 0:
                link[tail[r]] = i
            else:
                head[r] = i
            tail[r] = i
            queued[r, 0] += 1
            queued[r, 1] += uncached
            if cur[r] < 0:
                _next_step(r, cur, left, head, tail, link, work, queued, max_batch,
                           overhead_s, per_token_s, busy_out)
            continue
        prefill = (overhead_ms + ms_per_token * uncached) / 1000.0
        first = max(now, free_at[r]) + prefill
        free_at[r] = first
        busy_out[r] += prefill
        ttft_out[i] = first - now
        hlen = _heap_push(hkey, hval, hlen, first, 2 * i)
        hlen = _heap_push(hkey, hval, hlen, first + out_tokens[i] * tpot_ms / 1000.0,
                          2 * i + 1)
    if max_batch > 0:  # the steps still running at the last arrival
        advance_steps(np.inf, clock, left, cur, head, tail, link, work, queued, max_batch,
                      arrival, out_tokens, overhead_s, per_token_s, tpot_s, cores, ttft_out,
                      busy_out, hkey, hval, hlen)
    return ttl
