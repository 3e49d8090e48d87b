"""Job and worker events from every process sharing the database.

The triggers of migration 0006 send one NOTIFY per statement (many job ids
per payload) on the schema's events channel. One :class:`EventHub` per
Scheduler LISTENs on it through the Scheduler's existing listener connection
(only once someone waits or subscribes) and fans the events out: to
``wait_for()`` waiters by job id, and to subscriptions through a bounded
buffer each, so a slow subscriber drops events (counted) and never slows
anything else.

Delivery is at most once: a notification sent while the listener is
disconnected, or before it LISTENed, is lost. ``wait_for()`` therefore also
polls; a subscriber that must not miss a final state reads the job.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from ..enums import DEFAULT_QUEUE, FINAL_STATUS_VALUES
from ..store.events import EventStore
from ..support.log import get_logger
from .listener import Listener

log = get_logger(__name__)

# A job's final statuses are the kinds of the events that report them.
FINAL_KINDS = frozenset(FINAL_STATUS_VALUES)
JOB_KINDS = FINAL_KINDS | {"scheduled", "started", "progress", "retried", "rescued", "handed_back"}
WORKER_KINDS = frozenset({"worker_started", "worker_stopped"})
ALL_KINDS = JOB_KINDS | WORKER_KINDS
# Sent by the database only while a subscriber (or, for completed, a waiter)
# keeps its flag fresh (see store.event_sql).
FLAGGED_KINDS = frozenset({"scheduled", "started", "completed"})
FLAG_SECONDS = 60.0
# After a new flag is written: a statement that began before it sends no
# event, so waiters re-read within POLL_DOWN instead (results.wait_for).
FLAG_SETTLE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Event:
    """One event. ``attempt`` is the job's attempt number when it happened;
    ``worker_id`` the worker whose attempt it was (for worker events: the worker)."""

    kind: str
    at: datetime
    job_id: str | None = None
    task: str | None = None
    attempt: int | None = None
    worker_id: str | None = None
    #: The fraction reported (``progress`` events).
    progress: float | None = None
    #: The job's queue (worker events: "default").
    queue: str = DEFAULT_QUEUE
    hostname: str | None = None
    pid: int | None = None

    @property
    def outcome(self) -> str | None:
        """The final state this event reports (completed, failed, ...), else None."""
        return self.kind if self.kind in FINAL_KINDS else None


def check_kinds(kinds: Iterable[str] | str | None) -> frozenset[str]:
    if kinds is None:
        return ALL_KINDS
    chosen = frozenset([kinds] if isinstance(kinds, str) else kinds)
    unknown = chosen - ALL_KINDS
    if unknown:
        raise ValueError(f"unknown event kinds {sorted(unknown)}; known: {sorted(ALL_KINDS)}")
    return chosen


class Subscription:
    """Events matching one filter, buffered (at most ``maxsize``; beyond that
    new events are dropped and counted in :attr:`dropped`).

    ``async with scheduler.events(...) as events: async for event in events``:
    entering waits until the channel is LISTENed, leaving unsubscribes.
    """

    def __init__(
        self,
        hub: EventHub,
        kinds: frozenset[str],
        task: str | None,
        queue: str | None,
        maxsize: int,
    ) -> None:
        self._hub = hub
        self.kinds = kinds
        self.task = task
        self.queue = queue
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize)
        self.dropped = 0
        self.closed = False

    def wants(self, event: Event) -> bool:
        return (
            event.kind in self.kinds
            and (self.task is None or event.task == self.task)
            and (self.queue is None or event.queue == self.queue)
        )

    def offer(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "event subscriber too slow; dropping events (see Subscription.dropped)",
                    buffer=self._queue.maxsize,
                )

    async def ready(self) -> None:
        """Return once events sent from now on reach this subscription."""
        if not await self._hub.listening():
            raise RuntimeError(
                "events need a LISTEN connection: none is available (behind pgbouncer "
                "pass listen_dsn=, a direct connection to PostgreSQL)"
            )
        # The database sends these from now on (the flagger keeps them on).
        await self._hub.want(self.kinds & FLAGGED_KINDS)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._hub.remove(self)
        try:
            self._queue.put_nowait(None)  # wakes a reader waiting in __anext__
        except asyncio.QueueFull:
            pass

    async def __aenter__(self) -> Subscription:
        await self.ready()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if self.closed and self._queue.empty():
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event


class EventHub:
    """One Scheduler's share of the events channel: waiters and subscriptions."""

    def __init__(
        self, listener: Listener, pool: asyncpg.Pool, schema: str, enabled: bool = True
    ) -> None:
        self._listener = listener
        # False behind pgbouncer without listen_dsn: no LISTEN, waiters poll.
        self.enabled = enabled
        self.store = EventStore(pool, schema)
        self._subs: set[Subscription] = set()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._started_listener = False
        self._flagger: asyncio.Task[None] | None = None
        # Flagged kinds this hub asked for -> loop time until which that holds.
        self._asked: dict[str, float] = {}
        # Loop time until which a flag this hub newly wrote may still miss
        # statements already running (see flags_settling).
        self._settling_until = 0.0
        self._callbacks: set[asyncio.Task[None]] = set()

    @property
    def live(self) -> bool:
        return self._listener.live

    async def listening(self, timeout: float = 10.0) -> bool:
        """LISTEN on the events channel (starting the listener if this
        Scheduler was not started); False if notifications are not available."""
        if not self.enabled:
            return False
        if not self._listener.started:
            if self._started_listener:
                return False  # stopped by close()
            self._started_listener = True
            self._listener.start()
        await self._listener.add_channel(self.store.channel, self._on_notify)
        try:
            await asyncio.wait_for(self._listener.connected.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- waiters ---------------------------------------------------------------

    def watch(self, job_id: str) -> asyncio.Future[None]:
        """A future resolved when an event says ``job_id`` reached a final state.

        Completions are a flagged kind: ask for them (:meth:`want`) first."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, set()).add(future)
        if self._flagger is None and self.enabled:
            self._flagger = asyncio.create_task(self._keep_flags(), name="pg_scheduler.events")
        return future

    async def want(self, kinds: Iterable[str]) -> None:
        """Have the database send these flagged kinds for the next FLAG_SECONDS
        (one write, skipped while an earlier one has over half its time left)."""
        now = asyncio.get_running_loop().time()
        stale = sorted(k for k in FLAGGED_KINDS.intersection(kinds) if self._asked.get(k, 0) <= now)
        if not stale:
            return
        await self.store.want_kinds(stale, FLAG_SECONDS)
        for kind in stale:
            self._asked[kind] = now + FLAG_SECONDS / 2
        self._settling_until = asyncio.get_running_loop().time() + FLAG_SETTLE_SECONDS

    def flags_settling(self) -> bool:
        """True just after this hub newly asked for flagged kinds: a completion
        statement that began before that write sends no event, so a waiter
        must not count on one to end its wait."""
        return asyncio.get_running_loop().time() < self._settling_until

    async def want_quietly(self, kinds: Iterable[str]) -> None:
        """:meth:`want`, a failure logged (a role without INSERT, UPDATE on
        scheduler_event_flags): waiters then find the job by polling."""
        try:
            await self.want(kinds)
        except Exception as exc:
            log.warning(
                "could not ask for completion events; waiters poll instead", error=repr(exc)
            )
            now = asyncio.get_running_loop().time()
            for kind in FLAGGED_KINDS.intersection(kinds):
                self._asked[kind] = now + FLAG_SECONDS / 2  # do not ask on every wait

    def unwatch(self, job_id: str, future: asyncio.Future[None]) -> None:
        futures = self._waiters.get(job_id)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._waiters[job_id]

    # -- subscriptions -----------------------------------------------------------

    def subscribe(
        self,
        kinds: Iterable[str] | str | None = None,
        *,
        task: str | None = None,
        queue: str | None = None,
        maxsize: int = 10_000,
    ) -> Subscription:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize!r}")
        sub = Subscription(self, check_kinds(kinds), task, queue, maxsize)
        self._subs.add(sub)
        if sub.kinds & FLAGGED_KINDS and self._flagger is None:
            self._flagger = asyncio.create_task(self._keep_flags(), name="pg_scheduler.events")
        return sub

    def on(
        self,
        kind: Iterable[str] | str | None,
        callback: Callable[[Event], Awaitable[None] | None],
        **filters: Any,
    ) -> Subscription:
        """Call ``callback(event)`` (a function or coroutine function) for each
        event, one at a time, in order; close the returned subscription to stop."""
        sub = self.subscribe(kind, **filters)

        async def deliver() -> None:
            await sub.ready()
            async for event in sub:
                try:
                    outcome = callback(event)
                    if inspect.isawaitable(outcome):
                        await outcome
                except Exception:
                    log.exception("event callback failed", kind=event.kind)

        task = asyncio.create_task(deliver(), name="pg_scheduler.events.on")
        self._callbacks.add(task)
        task.add_done_callback(self._callbacks.discard)
        return sub

    def remove(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    async def _keep_flags(self) -> None:
        # Keep the database sending the flagged kinds while someone wants them.
        while True:
            wanted = {k for s in self._subs for k in s.kinds} & FLAGGED_KINDS
            if self._waiters:
                wanted.add("completed")
            if not wanted and not self._subs:
                self._flagger = None
                return
            if wanted:
                try:
                    await self.want(wanted)
                except Exception as exc:
                    log.warning("could not ask for events", kinds=sorted(wanted), error=repr(exc))
            await asyncio.sleep(FLAG_SECONDS / 3)

    async def close(self) -> None:
        for sub in list(self._subs):
            sub.close()
        for task in [self._flagger, *self._callbacks]:
            if task is not None:
                task.cancel()
        self._flagger = None
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)  # waiters look at the job once more
        if self._started_listener and self._listener.started:
            await self._listener.stop()

    # -- the notification handler ------------------------------------------------

    def _on_notify(self, payload: str) -> None:
        if not self._subs and not self._waiters:
            return
        data = json.loads(payload)
        kind = data["k"]
        at = datetime.fromtimestamp(data["t"], UTC)
        if "w" in data:
            events = [
                Event(kind, at, worker_id=w[0], hostname=w[1], pid=w[2], queue=DEFAULT_QUEUE)
                for w in data["w"]
            ]
        else:
            items = data["j"]
            if self._waiters and kind in FINAL_KINDS:
                for item in items:
                    for future in self._waiters.pop(item[0], ()):
                        if not future.done():
                            future.set_result(None)
            subs = [s for s in self._subs if kind in s.kinds]
            if not subs:
                return
            # Items before migration 0007 have no sixth element, the queue.
            events = [
                Event(kind, at, i[0], i[1], i[2], i[3], i[4], i[5] if len(i) > 5 else DEFAULT_QUEUE)
                for i in items
            ]
        for sub in self._subs:
            if kind in sub.kinds:
                for event in events:
                    if sub.wants(event):
                        sub.offer(event)
