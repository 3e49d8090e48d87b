"""Children: ``ctx.spawn``, ``ctx.wait`` and ``ctx.gather``.

A child is a normal job whose row names its parent and the spawn step that
made it. Its id is decided by that step (the parent's id, the parent's
incarnation and the step's place), so a run that reaches the spawn again
spawns nothing new. Spawns are kept in the run until something needs them
written (a wait, another step, a park, the workflow's end), then written with
their steps, up to SPAWN_CHUNK per statement.

A child's end (completed, failed, cancelled, expired) stays on its own row;
the parent reads it from there (the run's load, the wait's fresh read). In
the transaction that ends it, the database counts down a parent parked
waiting for it (its ``workflow_waits`` row) and wakes the parent at zero
(a completion statement once per parent for its batch, migration 0021; a
trigger for any other end, 0016); the outcome is copied onto the spawn step
only when the child's row is about to lose it (deleted, retried). A wait
reads those outcomes: a result, or the JobFailed / JobCancelled / JobExpired
the results API raises, always the same on a replay.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Generator, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple

import asyncpg

import pg_scheduler.observe.instrument as instrument

from ..enqueue import queue_keys
from ..enqueue.checks import check_max_retries, check_priority, check_retry_policy, check_timeout
from ..enqueue.fair import has_task_key as has_fair_key
from ..enqueue.fields import JobOptions
from ..enqueue.keys import NO_KEY, KeyFields, wants_keys
from ..enqueue.keys import resolve as resolve_keys
from ..enqueue.queue_keys import fair_given, fair_of
from ..enums import PRIORITY_DB_VALUE_OF, JobStatus
from ..models import Job
from ..store.workflows import Spawned
from ..support.codec import decode_json, encode_json, encode_retry_policy, encode_task_data
from ..tasks import QUEUE_ATTR, ensure_async, queue_of, task_name_of
from .replay import COMPLETED, WAITING, Record, record_of
from .run import RunState

#: A child without a fair share key: (key, weight).
NO_FAIR_KEY: tuple[str | None, float | None] = (None, None)
_VARIANT = dict(zip("0123456789abcdef", "89ab" * 4, strict=True))


def child_job_id(parent: str, incarnation: int, seq: int) -> str:
    """The id of the child spawned at ``seq``: a version 7 UUID whose time is
    the parent's creation, then 42 bits of a hash of the parent, then ``seq``.
    The same for every run of the parent; children of one parent sort
    together, in spawn order."""
    return f"{_child_id_prefix(parent, incarnation)}{seq & 0xFFFFFFFF:08x}"


@functools.lru_cache(maxsize=64)
def _child_id_prefix(parent: str, incarnation: int) -> str:
    """Everything of a child's id but its last 8 digits (``seq``): the same for
    every child of one run of ``parent``."""
    clock = f"{(incarnation // 1000) & 0xFFFFFFFFFFFF:012x}"
    h = hashlib.sha256(f"{parent}\x1f{incarnation}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{clock[:8]}-{clock[8:]}-7{h[0:3]}-{_VARIANT[h[3]]}{h[4:7]}-{h[7:11]}"


class ChildHandle:
    """A spawned child: ``job_id`` is its job's id (``scheduler.get_job`` and
    ``scheduler.result`` work on it from anywhere). ``await`` it to get it back
    (``child = await ctx.spawn(...)``); ``ctx.wait(child)`` for its result."""

    __slots__ = ("detached", "job_id", "seq", "task_name")

    def __init__(self, job_id: str, seq: int, task_name: str, detached: bool) -> None:
        self.job_id = job_id
        self.seq = seq
        self.task_name = task_name
        self.detached = detached

    def __await__(self) -> Generator[Any, None, ChildHandle]:
        return self
        yield  # a generator that returns at once

    def __repr__(self) -> str:
        return f"<ChildHandle {self.job_id} ({self.task_name}, step {self.seq})>"


def replayed(run: RunState, func: Callable[..., Any]) -> ChildHandle | None:
    """The child recorded at the run's next place, if the run reached it
    before (the spawn of ``func`` there): its handle, with no check or
    encoding of what was written then. None: spawn it (:func:`spawn`)."""
    run.check()
    seq = run.replay.next_seq
    if seq not in run.replay.records:
        return None
    task_name = task_name_of(func)
    taken, record = run.take("spawn", task_name, str(seq))
    assert record is not None and taken == seq
    recorded = record.result or {}
    return ChildHandle(recorded["job_id"], seq, task_name, bool(recorded.get("detached")))


#: The options of a ``ctx.spawn`` that gives none, as its signature's defaults
#: make them (no priority: the parent's). The one instance: a spawn with it
#: may reuse what an earlier spawn of the same function decided.
SPAWN_DEFAULTS = JobOptions(priority=None)  # type: ignore[arg-type]


class _Plan(NamedTuple):
    """What a spawn decided before its child is kept: the child's queue, task
    name and keys. One of a spawn with :data:`SPAWN_DEFAULTS` whose keys do not
    depend on the arguments is kept for the run's next spawns of its function
    (the function checked and registered)."""

    queue: str
    task_name: str
    keys: KeyFields = NO_KEY
    fair: tuple[str | None, float | None] = NO_FAIR_KEY


def spawn(
    run: RunState,
    buffer: list[Spawned],
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    options: JobOptions,
    detached: bool,
) -> ChildHandle:
    """A child of ``func(*args, **kwargs)``, kept in ``buffer`` until written.
    ``options``: those ``ctx.spawn`` takes (a priority of None: the parent's)."""
    run.check()
    if not isinstance(detached, bool):
        raise TypeError(f"detached must be True or False, got {detached!r}")
    plan = run.spawn_plans.get(func) if options is SPAWN_DEFAULTS else None
    if plan is not None:
        return _buffered(run, buffer, func, args, kwargs, options, detached, plan)
    # Every check before anything is taken or written.
    ensure_async(func)
    if options.priority is not None:
        check_priority(options.priority)
    check_max_retries(options.max_retries)
    check_timeout(options.timeout)
    check_retry_policy(options.retry_policy)
    child_queue = None if options.queue is None else queue_of(func, options.queue)
    if child_queue is None:
        # The task's own queue if it declares one, else the parent's.
        child_queue = queue_of(func) if hasattr(func, QUEUE_ATTR) else run.queue
    defaults = queue_keys.of(child_queue)
    keys, fair = NO_KEY, NO_FAIR_KEY
    keyed = defaults is not None or wants_keys(options, func)
    if keyed:
        keys = resolve_keys(
            func, options, args, kwargs, defaults, fair_given(defaults, options, func)
        )
    shared = (
        defaults is not None
        or options.fair_share_key is not None
        or options.fair_share_weight is not None
        or has_fair_key(func)
    )
    if shared:
        fair = fair_of(func, options, args, kwargs, defaults, keys)
    run.registry.register(func)  # this worker can run it, as schedule() does
    task_name = task_name_of(func)
    plan = _Plan(child_queue, task_name, keys, fair)
    if options is SPAWN_DEFAULTS and not keyed and not shared:
        # Nothing here depended on the arguments: the next spawn of func reuses it.
        run.spawn_plans[func] = plan
    return _buffered(run, buffer, func, args, kwargs, options, detached, plan)


def _buffered(
    run: RunState,
    buffer: list[Spawned],
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    options: JobOptions,
    detached: bool,
    plan: _Plan,
) -> ChildHandle:
    """The spawn, checked and decided (``plan``), taken at the run's next
    place and kept in ``buffer`` (or the child the run recorded there)."""
    child_queue, task_name, keys, fair = plan
    task_data = encode_task_data(args, kwargs, task_name)
    key = str(run.replay.next_seq)
    seq, record = run.take("spawn", task_name, key)
    if record is not None:
        recorded = record.result or {}
        return ChildHandle(recorded["job_id"], seq, task_name, bool(recorded.get("detached")))
    job_id = child_job_id(run.lease.job_id, run.incarnation, seq)
    if instrument.trace_injector is not None:  # the spawning run's span is the parent
        task_data = instrument.trace_injector(task_data, None)
    policy = options.retry_policy
    buffer.append(
        Spawned(
            job_id,
            func.__name__,
            task_name,
            task_data,
            run.priority if options.priority is None else PRIORITY_DB_VALUE_OF[options.priority],
            options.max_retries,
            None if options.timeout is None else float(options.timeout),
            None if policy is None else encode_retry_policy(policy),
            child_queue,
            seq,
            task_name,
            key,
            # The spawn step's record: the id is hex digits and dashes only.
            f'{{"job_id": "{job_id}", "detached": {"true" if detached else "false"}}}',
            *keys,
            *fair,
        )
    )
    return ChildHandle(job_id, seq, task_name, detached)


#: Children written per statement: each chunk commits on its own, so the first
#: children run while the next are written (a replay spawns the rest again,
#: under the same ids).
SPAWN_CHUNK = 1000


async def _spawn(
    run: RunState, children: list[Spawned], conn: asyncpg.Connection
) -> tuple[bool, int]:
    return await run.store.spawn(conn, run.lease, children, run.now())


async def flush(run: RunState, buffer: list[Spawned]) -> None:
    """Write every spawn kept in ``buffer``: the children and their steps, a
    chunk per statement."""
    while buffer:
        run.check()
        children = buffer[:SPAWN_CHUNK]
        held, _ = await run.write(partial(_spawn, run, children))
        if not held:
            raise run.lost()
        del buffer[: len(children)]
        for child in children:
            run.replay.keep(
                Record(
                    child.seq,
                    "spawn",
                    child.name,
                    child.key,
                    WAITING,
                    decode_json(child.record),
                    None,
                    1,
                )
            )


def _ended(run: RunState, seqs: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The outcomes of the children at ``seqs`` known to this run."""
    found: dict[int, dict[str, Any]] = {}
    for seq in seqs:
        record = run.replay.records.get(seq)
        if record is not None and record.status == COMPLETED:
            found[seq] = (record.result or {}).get("outcome") or {}
    return found


async def _read_ends(
    run: RunState, db: asyncpg.Connection, seqs: Sequence[int], ended: dict[int, Any]
) -> dict[int, dict[str, Any]]:
    """Read which of the children at ``seqs`` not in ``ended`` have ended since,
    keep their records, and return the outcomes of every child at ``seqs``
    known to have ended."""
    asked = sorted({s for s in seqs if s not in ended})
    if asked:
        records = run.replay.records
        for row in await run.store.spawned_ended(db, run.lease.job_id, asked):
            if row[0] in records:
                run.replay.keep(record_of(row))
    return _ended(run, seqs)


def _span(run: RunState, awaited: set[int], ended: dict[int, Any]) -> tuple[int, int]:
    """The seqs a park waits on: from the first unfinished awaited child, as
    far as only awaited spawns follow (a spawn not waited for ends the span;
    the next park takes the rest), as a half-open range."""
    spawns = sorted(s for s, r in run.replay.records.items() if r.kind == "spawn")
    first = min(s for s in awaited if s not in ended)
    last = first
    for seq in spawns[spawns.index(first) + 1 :]:
        if seq not in awaited:
            break
        last = seq
    return first, last + 1


def spans(seqs: Sequence[int]) -> list[list[int]]:
    """``seqs`` in their order as runs of consecutive steps, ``[first, last]``
    each: what a wait's record keeps of the children it waited on (a gather of
    10,000 children is one pair, not 10,000 numbers written twice)."""
    runs: list[list[int]] = []
    for seq in seqs:
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return runs


async def wait(
    run: RunState, buffer: list[Spawned], handles: Sequence[ChildHandle], name: str
) -> list[dict[str, Any]]:
    """The outcomes of ``handles``' children, in their order, once all ended."""
    await flush(run, buffer)
    run.check()
    seqs = [h.seq for h in handles]
    key = str(run.replay.next_seq)
    seq, record = run.take("wait", name, key)
    result = encode_json({"children": len(seqs), "spans": spans(seqs)})
    ended = _ended(run, seqs)
    if len(ended) == len(set(seqs)):
        if record is None:
            await run.record(seq, "wait", name, key, COMPLETED, result, started_at=run.now())
        elif record.status == WAITING:
            await _finish(run, seq, name, key, result)
        return [ended[s] for s in seqs]
    started = run.now()
    store, lease = run.store, run.lease
    # The ends so far, read without the lock below: every child's end waits
    # for that lock, so it is held only to read the ends that came meanwhile.
    ended = await run.write(lambda c: _read_ends(run, c, seqs, ended))
    async with run.locked() as (conn, locked):
        # Every child's end takes this lock first: the read below sees each
        # end committed before it, and each end after it counts this park down.
        await store.lock_family(conn, lease.job_id)
        ended = await _read_ends(run, conn, seqs, ended)
        if len(ended) == len(set(seqs)):
            held, _ = await store.finish_wait(conn, lease, seq, "wait", name, key, result, started)
            if not held:
                raise run.lost()
            run.replay.keep(Record(seq, "wait", name, key, COMPLETED, None, None, 1))
            return [ended[s] for s in seqs]
        deadline = locked["workflow_deadline"]
        if deadline is not None and deadline <= locked["db_now"]:
            raise run.halt(run.deadline_passed())
        soon = deadline is not None and deadline <= locked["db_now"] + timedelta(
            seconds=run.lookahead
        )
        awaited = set(seqs)
        span = _span(run, awaited, ended)
        # Each of these children's ends counts the park down (0016).
        left = sum(1 for s in awaited if span[0] <= s < span[1] and s not in ended)
        parked = await store.park(
            conn, lease, seq, "wait", name, key, result, "children", None, deadline, soon, span,
            started, left,
        )  # fmt: skip
        if parked is None:
            raise run.lost()
    raise run.parked()


async def _finish(run: RunState, seq: int, name: str, key: str, result: str) -> None:
    held, _ = await run.write(
        lambda c: run.store.finish_wait(c, run.lease, seq, "wait", name, key, result, run.now())
    )
    if not held:
        raise run.lost()


def result_of(handle: ChildHandle, ended: dict[str, Any]) -> Any:
    """A child's result, or the JobFailed / JobCancelled / JobExpired of its end."""
    status = ended.get("status")
    if status == "completed":
        return ended.get("result")
    # The results API's own outcome (api/ sits above the engine, which runs
    # workflows: imported when a child did not complete, not with this module).
    from ..api.results import outcome as job_outcome

    job = Job.model_construct(
        job_id=handle.job_id,
        task_name=handle.task_name,
        status=JobStatus(status or "failed"),
        error=ended.get("error"),
        traceback=None,
        result=None,
    )
    return job_outcome(job)
