"""The feedback ledger of a routing service: the one set of rules by which ratings reach the
router, whoever serves the calls (the proxy, LiteLLM).

A routed call is kept (:meth:`FeedbackLedger.record`) until it is rated or its window
passes. A rating is a quality in [0, 1], checked here and nowhere else; the call's reward is
the router's ``quality - lam * cost`` (paper Section 4, "Routing"), added at every region of
its chain. Each call is rated once;
an episode's terminal reward is credited to every open call of the episode (paper Appendix
E). Calls are written by one background thread, in batches, so a caller never waits on the
store longer than it chooses (a store held in this process, whose write is a dictionary's, is
written at once instead: ``inline``); a busy store raises
:class:`~canopy.regional.store.StoreBusy` on a rating (retry later) and never loses a call
it holds in its queue. The calls this process stores and has not seen rated (through itself,
or through another process: :meth:`FeedbackLedger.forget_rated`, at each pull) are also kept
here (the most recent ``max_queued``), so a store restarted empty gets them back
(:meth:`FeedbackLedger.restore`), a rating for a call made before the outage still counts and
a call rated before it cannot be rated again. An outcome that needs no rating (a gateway's
time to first token: :meth:`FeedbackLedger.observe`) is credited the same way, with no call
kept: observations wait here, at most ``max_queued`` of them, until the next
:meth:`FeedbackLedger.flush` adds them in one atomic step. Every refusal is a
:class:`FeedbackError` whose type carries the HTTP ``status`` and ``code`` a service answers
with.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from canopy.regional.circuit import StoreCircuit, StoreDown
from canopy.regional.store import Call, Increment, Store, StoreBusy
from canopy.validation import check_number

__all__ = ["AlreadyRated", "FeedbackError", "FeedbackExpired", "FeedbackLedger",
           "InvalidRating", "RatingOfWrongKind", "RatingOutOfRange", "UnknownCall",
           "check_rating"]

log = logging.getLogger("canopy.regional")
_STORED: concurrent.futures.Future[None] = concurrent.futures.Future()
_STORED.set_result(None)  # what an inline write returns: done (shared, never changed)


class FeedbackError(Exception):
    """A rating the rules refuse; ``status`` and ``code`` are what an HTTP service answers."""

    status = 400
    code = "bad_feedback"


class UnknownCall(FeedbackError):
    status, code = 404, "unknown_request"


class AlreadyRated(FeedbackError):
    status, code = 409, "duplicate_feedback"


class FeedbackExpired(FeedbackError):
    status, code = 410, "feedback_expired"


class InvalidRating(FeedbackError):
    """A rating that is not a number in [0, 1]."""

    status, code = 422, "invalid_rating"


class RatingOfWrongKind(InvalidRating, TypeError):
    """A rating that is not a number at all (a string, a bool, ``None``)."""


class RatingOutOfRange(InvalidRating, ValueError):
    """A number outside [0, 1], or not finite."""


def check_rating(value: object, name: str = "quality") -> float:
    """``value`` as a rating in [0, 1] (:func:`canopy.validation.check_number`), refused as
    an :class:`InvalidRating` that is also the ``TypeError`` or ``ValueError`` of the rule."""
    try:
        return check_number(value, name, low=0.0, high=1.0)
    except TypeError:
        raise RatingOfWrongKind(f"{name} must be a number in [0, 1], got "
                                f"{type(value).__name__}") from None
    except ValueError as error:
        raise RatingOutOfRange(str(error)) from None


class FeedbackLedger:
    """Pending calls and their ratings over a :class:`~canopy.regional.store.Store`.

    ``chain(region)`` gives the region paths a reward in ``region`` updates (the router's
    ``RegionalRouter.chain_paths``); ``reward(quality, cost)``
    is the router's reward (``RegionalRouter.reward``);
    ``window_s`` is how long a call accepts its rating; at most ``max_queued`` calls wait
    for the store (past that a call is dropped, with a warning: it is served, not rated);
    a rating of a call still waiting waits for it at most ``wait_s`` (then ``StoreBusy``),
    so a caller need not wait for its call to be stored before it answers. ``inline``: the
    store lives in this process and nobody else reads it (a ``memory`` store): a call is
    written in the caller's thread as it is recorded, with no future, queue or wake-up of
    the writer, and none is kept for :meth:`restore` (such a store is never restarted
    without this process); should it refuse one, the call is queued as any other."""

    def __init__(self, store: Store, *, reward: Callable[[float, float], float],
                 chain: Callable[[str], list[str]], window_s: float = 7 * 24 * 3600.0,
                 max_queued: int = 100_000, wait_s: float = 0.0, inline: bool = False
                 ) -> None:
        self.store = store
        self.window_s = float(window_s)
        self.wait_s = float(wait_s)
        self.inline = inline
        self._reward = reward
        self._chain = chain
        self._queue: queue.Queue[tuple[Call, concurrent.futures.Future[None]] | None] = \
            queue.Queue(maxsize=max_queued)
        self._queued: dict[str, tuple[Call, concurrent.futures.Future[None]]] = {}
        self._queued_lock = threading.Lock()
        self._pending: OrderedDict[str, Call] = OrderedDict()  # (being) stored, not seen rated
        self._max_pending = max_queued
        self._observed: deque[tuple[list[Increment], float]] = deque()
        self._closing = threading.Event()
        self.dropped = 0
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name="canopy-ledger-writer")
        self._writer.start()

    # -- calls -----------------------------------------------------------------------------
    def record(self, call: Call) -> concurrent.futures.Future[None]:
        """Queue ``call`` for the store (``inline``: write it now, and queue it only when the
        store refuses it); the future completes when it is stored, or at once with
        :class:`~canopy.regional.circuit.StoreDown` while the store's circuit is open (the
        call stays queued: nobody waits on a store that is down)."""
        if self.inline:
            try:
                self.store.add_calls((call,), self.window_s)
                return _STORED
            except StoreBusy:  # queued, kept and retried as any call
                pass
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._queued_lock:
            self._queued[call.id] = (call, done)
        try:
            self._queue.put_nowait((call, done))
        except queue.Full:
            with self._queued_lock:
                self._queued.pop(call.id, None)
            self.dropped += 1
            log.warning("the store is behind by %d calls: call %s is served but cannot be "
                        "rated", self._queue.maxsize, call.id)
            done.set_exception(StoreBusy("the ledger's queue is full"))
            return done
        if isinstance(self.store, StoreCircuit) and self.store.down:
            failed: concurrent.futures.Future[None] = concurrent.futures.Future()
            failed.set_exception(StoreDown("the store is down: the call waits in the queue"))
            return failed
        return done

    def _write_loop(self) -> None:
        wait = 0.05
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < 512:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(more)
            with self._queued_lock:  # kept before it is stored: rated, it can be forgotten
                for call, _ in batch:
                    self._pending[call.id] = call
                while len(self._pending) > self._max_pending:
                    self._pending.popitem(last=False)
            while True:
                try:
                    self.store.add_calls([c for c, _ in batch], self.window_s)
                    break
                except StoreBusy as error:
                    if self._closing.is_set():
                        log.error("%d calls not stored at shutdown: %s", len(batch), error)
                        break
                    if not isinstance(error, StoreDown):  # the circuit said so once
                        log.warning("storing %d calls: %s; retrying", len(batch), error)
                    time.sleep(wait)
                    wait = min(2 * wait, 1.0)
            wait = 0.05
            with self._queued_lock:
                for call, _ in batch:
                    self._queued.pop(call.id, None)
            for _, done in batch:
                done.set_result(None)

    def _wait_stored(self, waiting: list[tuple[Call, concurrent.futures.Future[None]]]
                     ) -> None:
        """Wait (at most ``wait_s``) for these queued calls to be stored; ``StoreBusy``
        when one is still queued."""
        if not waiting:
            return
        concurrent.futures.wait([done for _, done in waiting], timeout=self.wait_s)
        with self._queued_lock:
            late = next((c for c, _ in waiting if c.id in self._queued), None)
        if late is not None:
            raise StoreBusy(f"call {late.id} is not stored yet")

    def _stored(self, ids: Sequence[str]) -> list[Call | None]:
        with self._queued_lock:
            waiting = [self._queued[one] for one in ids if one in self._queued]
        self._wait_stored(waiting)
        return self.store.calls(ids)

    def call(self, call_id: str) -> Call | None:
        """The call of ``call_id`` as stored (``None``: unknown or forgotten); ``StoreBusy``
        while it waits in the queue (past ``wait_s``)."""
        return self._stored([call_id])[0]

    # -- ratings ---------------------------------------------------------------------------
    def _increments(self, region: str, model: str, quality: float, cost: float
                    ) -> list[Increment]:
        """One outcome's reward at every region of its chain."""
        reward = self._reward(quality, cost)
        return [Increment(path, model, 1.0, reward) for path in self._chain(region)]

    def _credit(self, calls: Sequence[Call], quality: float) -> None:
        increments = [i for c in calls for i in self._increments(c.region, c.model, quality,
                                                                 c.cost)]
        rated = self.store.rate([c.id for c in calls], quality, increments,
                                max(c.cost for c in calls))
        with self._queued_lock:
            for c in calls:
                self._pending.pop(c.id, None)
        if not rated:
            raise AlreadyRated("already has feedback (another rating came first)")

    def restore(self) -> int:
        """Store again the calls this process stored and has not seen rated (a store
        restarted empty lost them; storing one twice changes nothing); how many."""
        with self._queued_lock:
            calls = list(self._pending.values())
        for start in range(0, len(calls), 512):
            self.store.add_calls(calls[start:start + 512], self.window_s)
        return len(calls)

    def forget_rated(self, since: int) -> None:
        """Forget the calls kept for :meth:`restore` that were rated (through any process)
        at a store version after ``since``
        (:meth:`~canopy.regional.store.Store.rated_since`; past what the store keeps, each
        kept call is looked up), so a store restarted empty gets back only calls still
        awaiting a rating. Raises ``StoreBusy``."""
        with self._queued_lock:
            if not self._pending:
                return
        rated = self.store.rated_since(since)
        if rated is None:
            with self._queued_lock:
                kept = list(self._pending)
            rated = [one for start in range(0, len(kept), 512)
                     for one, call in zip(kept[start:start + 512],
                                          self.store.calls(kept[start:start + 512]),
                                          strict=True)
                     if call is not None and call.quality is not None]
        with self._queued_lock:
            for one in rated:
                self._pending.pop(one, None)

    def rate(self, call_id: str, quality: float) -> Call:
        """Credit ``quality`` to one call; the call, rated. Raises :class:`InvalidRating`,
        :class:`UnknownCall`, :class:`AlreadyRated`, :class:`FeedbackExpired` or
        ``StoreBusy``."""
        quality = check_rating(quality)
        call = self.call(call_id)
        if call is None:
            raise UnknownCall(f"unknown request id {call_id!r}")
        if call.quality is not None:
            raise AlreadyRated(f"request {call_id!r} already has feedback ({call.quality})")
        if time.time() - call.created > self.window_s:
            raise FeedbackExpired(f"request {call_id!r} is older than the feedback window "
                                  f"({self.window_s:g} s)")
        self._credit([call], quality)
        return replace(call, quality=quality)

    def rate_episode(self, episode: str, reward: float) -> list[Call]:
        """Credit an episode's terminal ``reward`` as the quality of each of its calls not
        yet rated and within the window (paper Appendix E); those calls, rated."""
        reward = check_rating(reward, "reward")
        with self._queued_lock:
            waiting = [entry for entry in self._queued.values() if entry[0].episode == episode]
        self._wait_stored(waiting)
        calls = self.store.episode(episode)
        if not calls:
            raise UnknownCall(f"unknown episode {episode!r}")
        oldest = time.time() - self.window_s
        open_calls = [c for c in calls if c.quality is None and c.created >= oldest]
        if not open_calls:
            raise AlreadyRated(f"every call of episode {episode!r} already has feedback or "
                               "has expired")
        self._credit(open_calls, reward)
        return [replace(c, quality=reward) for c in open_calls]

    def observe(self, region: str, model: str, quality: float, cost: float) -> None:
        """An outcome with no call awaiting a rating (checked by the caller): its reward,
        at every region of its chain, waits for :meth:`flush`. Never touches the store; past
        ``max_queued`` waiting observations the oldest is dropped (counted in ``dropped``)."""
        increments = self._increments(region, model, quality, cost)
        with self._queued_lock:
            if len(self._observed) >= self._max_pending:
                self._observed.popleft()
                self.dropped += 1
            self._observed.append((increments, cost))

    def flush(self) -> int:
        """Add the waiting observations to the store (:meth:`Store.rate` with no call: one
        atomic step per 512 of them); how many. Raises ``StoreBusy`` (``StoreReset`` after
        a restart), keeping those not written for the next flush."""
        with self._queued_lock:
            batch = list(self._observed)
            self._observed.clear()
        written = 0
        try:
            while written < len(batch):
                part = batch[written:written + 512]
                self.store.rate([], 0.0, [i for increments, _ in part for i in increments],
                                max(cost for _, cost in part))
                written += len(part)
        except StoreBusy:
            with self._queued_lock:  # back in front of the newer ones, still bounded
                self._observed.extendleft(reversed(batch[written:]))
                while len(self._observed) > self._max_pending:
                    self._observed.popleft()
                    self.dropped += 1
            raise
        return written

    def expire(self) -> int:
        """Forget the calls older than two windows (at least a window and a second), so a
        late rating still learns it came too late (410, not 404); how many."""
        oldest = time.time() - self.window_s
        with self._queued_lock:
            while self._pending and next(iter(self._pending.values())).created < oldest:
                self._pending.popitem(last=False)
        return self.store.expire(oldest - max(self.window_s, 1.0))

    def close(self, timeout: float = 5.0) -> None:
        """Store what is queued (waiting at most ``timeout`` for a busy store), then stop."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._writer.join(timeout)
        self._closing.set()
        self._writer.join(timeout)
