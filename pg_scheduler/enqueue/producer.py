"""The one producer: every way a job gets in turns into checked rows here and is
written here, per conflict policy.

:class:`Producer` builds rows (no database): a call's function, arguments and
:class:`~pg_scheduler.enqueue.fields.JobOptions`, a 0.2.x insert by name, or
``schedule_bulk``'s specs. :class:`Enqueuer` writes them through asyncpg for
``Scheduler.schedule``, ``schedule_job``, ``schedule_bulk``, the periodic
enqueuer and ``SyncClient`` on its own connection; ``dbapi.DbapiEnqueuer``
writes the same rows through a caller's psycopg connection (``SyncClient(...,
connection=)``). Everything is checked and serialized before anything is
written, so bad input raises at the call and writes nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from itertools import chain
from typing import Any, TypeVar

import asyncpg

import pg_scheduler.observe.instrument as instrument

from ..config import UNSET
from ..enums import ConflictResolution
from ..job_spec import JobSpec
from ..store import NewJob, Store
from ..store.bounded import holding
from ..store.orphans import OrphanStore
from ..support.codec import encode_task_data
from ..support.log import get_logger
from ..support.pool_release import autocommitted
from ..support.reconnect import retry_on_disconnect
from ..support.validation import check_int, check_name
from ..tasks import TaskRegistry, ensure_async, queue_of, task_name_of
from ..workflows.decorator import is_workflow
from . import queue_keys
from .arguments import check_arguments
from .checks import when_of
from .conflicts import (
    check_conflict_resolution,
    check_none_existing,
    check_repeated_ids,
    duplicate_id_error,
)
from .dedupe import resolve as resolve_dedupe
from .dependencies import Graph, GraphWriter, plan
from .fields import JobFields, JobOptions, check_job, row_of
from .ids import new_job_id
from .keyed import KeyedWriter, KeyRace, check_batch_keys, is_dedupe_violation
from .keys import resolve as resolve_keys
from .queue_keys import fair_given, fair_of
from .rows import COPY_THRESHOLD, spec_rows, spec_tuples, streamable
from .timed import TimedWriter
from .timing import check_timed_call, timing_of

# A write that finds a dedupe key changing hands under it starts over this often.
KEY_RACE_ATTEMPTS = 20

# schedule_job's check of a name not registered here: the names of workers seen
# within this many seconds, read at most this often.
NAME_CHECK_WITHIN = 300.0
NAME_CHECK_EVERY = 5.0
# Names already warned about in this process.
_warned_names: set[str] = set()

# The lines logged here keep the Scheduler's logger name (log filters match it).
log = get_logger("pg_scheduler.scheduler")

T = TypeVar("T")

#: ``Scheduler.schedule``'s start in the same process: given a due row, None
#: (no worker here takes it) or the write of the row already claimed (True:
#: written; False: no free slot, nothing written; None: the answer was lost).
StartHere = Callable[[NewJob], Awaitable[bool | None] | None]


def check_positional(value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"positional must be True or False, got {value!r}")


def check_by_name(job_name: Any, task_data: Any) -> None:
    """A 0.2.x insert by name: a task name and ``{"args": [...], "kwargs": {...}}``."""
    if not isinstance(job_name, str) or not job_name:
        raise ValueError("job_name must be a non-empty string")
    check_name("job_name", job_name)
    if not isinstance(task_data, dict):
        raise TypeError(f"task_data must be a dict, got {type(task_data).__name__}")
    unknown_keys = set(task_data) - {"args", "kwargs"}
    if unknown_keys:
        raise ValueError(f"task_data may hold only 'args' and 'kwargs', got {unknown_keys}")


def check_bulk_call(conflict: Any, batch_size: Any, positional: Any) -> None:
    """``schedule_bulk``'s own keywords, checked before its specs."""
    check_positional(positional)
    check_conflict_resolution(conflict)
    check_int("batch_size", batch_size, 1)


class Producer:
    """Checked rows for one registry and misfire default; no database. The
    async :class:`Enqueuer` and the sync client's DB-API writer share it."""

    def __init__(
        self, registry: TaskRegistry, default_misfire_grace_time: Callable[[], int | None]
    ) -> None:
        self.registry = registry
        self.default_misfire_grace_time = default_misfire_grace_time

    def register(self, func: Callable[..., Any]) -> str:
        """Check ``func`` and register it so this worker runs it; its task name."""
        ensure_async(func)
        self.registry.register(func)
        return task_name_of(func)

    def call_fields(
        self,
        func: Callable[..., Any],
        execution_time: Any,
        args: Any,
        kwargs: Any,
        options: JobOptions,
    ) -> JobFields:
        """The checked fields of ``func(*args, **kwargs)`` at ``execution_time``;
        registers ``func`` so this worker runs it. The task's queue and dedupe
        key apply where ``options`` name none. Arguments ``func`` cannot take
        raise TypeError here, before anything is written."""
        if isinstance(func, str):
            raise TypeError(
                f"schedule() takes the task's function itself, got the name {func!r}; "
                f"to schedule by name, use schedule_job({func!r}, ...)"
            )
        queue = queue_of(func, options.queue)
        task_name = self.register(func)
        task_data = encode_task_data(args, {} if kwargs is None else kwargs, task_name)
        check_arguments(func, args, kwargs)
        key, scope = resolve_dedupe(func, options.dedupe_key, options.dedupe_scope, args, kwargs)
        defaults = queue_keys.of(queue)
        keys = resolve_keys(
            func, options, args, kwargs, defaults, fair_given(defaults, options, func)
        )
        if instrument.trace_injector is not None:  # the caller's trace context
            # A workflow without a current span: a trace of its own.
            root = f"schedule {task_name}" if is_workflow(func) else None
            task_data = instrument.trace_injector(task_data, root)
        check_job(execution_time, options)
        timing = timing_of(func, options)
        if timing is not None:
            check_timed_call(timing, key, execution_time, options)
            scope = timing.kind
        fair = fair_of(func, options, args, kwargs, defaults, keys)
        aware = when_of(execution_time, options.delay)
        return JobFields(
            func.__name__,
            task_name,
            aware,
            task_data,
            options,
            key,
            scope,
            queue,
            keys,
            timing,
            *fair,
        )

    def name_fields(
        self, job_name: Any, execution_time: Any, task_data: Any, options: JobOptions
    ) -> JobFields:
        """The checked fields of a 0.2.x insert by name (``schedule_job``): the
        job runs on a worker that registered a task named ``job_name``. A task's
        own dedupe key does not apply; its queue does, if it is registered here,
        and so does its signature: arguments it cannot take raise TypeError."""
        check_by_name(job_name, task_data)
        key, scope = resolve_dedupe(None, options.dedupe_key, options.dedupe_scope)
        func = self.registry.resolve(job_name)
        queue = queue_of(func, options.queue)
        args, kwargs = task_data.get("args") or (), task_data.get("kwargs") or {}
        defaults = queue_keys.of(queue)
        keys = resolve_keys(
            None, options, args, kwargs, defaults, fair_given(defaults, options, func)
        )
        encoded = encode_task_data(args, kwargs, job_name)
        if func is not None:
            check_arguments(func, args, kwargs)
        check_job(execution_time, options)
        fair = fair_of(func, options, args, kwargs, defaults, keys)
        aware = when_of(execution_time, options.delay)
        return JobFields(
            job_name, job_name, aware, encoded, options, key, scope, queue, keys, None, *fair
        )

    def new_row(self, fields: JobFields, job_id: str | None = None) -> NewJob:
        """The row of checked ``fields``; ``job_id``: one generated beforehand."""
        return row_of(
            fields,
            fields.options.job_id or job_id or new_job_id(),
            self.default_misfire_grace_time,
        )

    def call_row(
        self,
        func: Callable[..., Any],
        execution_time: Any,
        args: Any,
        kwargs: Any,
        options: JobOptions,
    ) -> NewJob:
        """The checked row of one ``schedule()`` call (see :meth:`call_fields`)."""
        return self.new_row(self.call_fields(func, execution_time, args, kwargs, options))

    def bulk_rows(self, jobs: Any) -> list[NewJob]:
        """The checked rows of ``jobs`` (a list of JobSpec)."""
        if not isinstance(jobs, Sequence):
            raise TypeError("jobs must be a list of JobSpec")
        return list(self.spec_rows(jobs))

    def spec_rows(self, jobs: Sequence[JobSpec]) -> Iterator[NewJob]:
        """Each spec checked again and made a row (see ``rows.spec_rows``)."""
        return spec_rows(jobs, self.register, self.default_misfire_grace_time)

    def spec_tuples(
        self, jobs: Sequence[JobSpec], into: list[tuple[Any, ...]]
    ) -> Iterator[tuple[Any, ...]]:
        """:meth:`spec_rows` as plain tuples for COPY (see ``rows.spec_tuples``)."""
        return spec_tuples(jobs, self.register, self.default_misfire_grace_time, into)


class Enqueuer:
    """Writes the :class:`Producer`'s rows for one Scheduler (its registry and
    defaults) through asyncpg."""

    def __init__(
        self,
        store: Store,
        pool: asyncpg.Pool,
        registry: TaskRegistry,
        default_misfire_grace_time: Callable[[], int | None],
    ) -> None:
        self.store = store
        self.pool = pool
        self.producer = Producer(registry, default_misfire_grace_time)
        self.keyed = KeyedWriter(store)
        # The task names workers listed at the last read (schedule_job's check).
        self._worker_tasks: set[str] = set()
        self._worker_tasks_read = -NAME_CHECK_EVERY
        self.graph = GraphWriter(store)
        self.timed = TimedWriter(store, pool)

    # -- the entry points ------------------------------------------------------------

    async def schedule(
        self,
        func: Callable[..., Any],
        execution_time: Any,
        args: Any,
        kwargs: Any,
        options: JobOptions,
        conflict: Any,
        connection: asyncpg.Connection | None,
        start_here: StartHere | None = None,
    ) -> str:
        """``Scheduler.schedule``: one job; its id (with a dedupe key under
        IGNORE/REPLACE, the id of the job that holds the key).

        ``start_here``: a due job with a generated id, written outside the
        caller's transaction, may be written already claimed by a worker of
        this process (the job must not start before a caller's commit)."""
        check_conflict_resolution(conflict)
        fields = self.producer.call_fields(func, execution_time, args, kwargs, options)
        row = self.producer.new_row(fields)
        if fields.timing is not None:
            # Debounce and throttle decide what a held key means: conflict is not consulted.
            return await self.timed.write(row, fields.timing, func, args, kwargs, connection)
        user_id = options.job_id is not None
        if options.depends_on:
            return await self._write_dependent(row, options, conflict, connection)
        if row.dedupe_key is not None:
            # Not started in process: the key's conflict policy settles it first.
            return await self.write_keyed_one(row, conflict, connection, user_id)
        started = None
        if start_here is not None and connection is None and not user_id:
            started = start_here(row)
        written = None if started is None else await started
        if not written:
            await self.write(
                [row],
                conflict,
                connection,
                user_ids=user_id,
                retried=written is None and started is not None,
            )
        log.debug(
            "job scheduled",
            event_type="scheduled",
            job_id=row.job_id,
            task=row.task_name,
            execution_time=row.execution_time.isoformat(),
        )
        return row.job_id

    async def schedule_by_name(
        self,
        job_name: Any,
        execution_time: Any,
        task_data: Any,
        options: JobOptions,
        conflict: Any,
    ) -> str:
        """``schedule_job`` (0.2.x): one job by task name (see
        :meth:`Producer.name_fields`); ``misfire_grace_time=None`` there means
        the scheduler's default, as in 0.2.x. A name neither registered here
        nor listed by a worker seen lately is logged as a warning (a typo
        waits for ever), and the job is written all the same: its worker may
        simply not have started yet."""
        if task_data is None:
            task_data = {}
        check_by_name(job_name, task_data)
        check_conflict_resolution(conflict)
        if options.misfire_grace_time is None:
            options = dataclasses.replace(options, misfire_grace_time=UNSET)
        fields = self.producer.name_fields(job_name, execution_time, task_data, options)
        row = self.producer.new_row(fields)
        if job_name not in self.producer.registry:
            await self._check_name(job_name)
        user_id = options.job_id is not None
        if options.depends_on:
            return await self._write_dependent(row, options, conflict, None)
        if row.dedupe_key is not None:
            return await self.write_keyed_one(row, conflict, None, user_id)
        await self.write([row], conflict, None, user_ids=user_id)
        log.debug("job scheduled", event_type="scheduled", job_id=row.job_id, task=job_name)
        return row.job_id

    async def _check_name(self, job_name: str) -> None:
        """Warn, once per name and process, about a task name no worker seen in
        the last ``NAME_CHECK_WITHIN`` seconds lists. The names workers list
        are read at most every ``NAME_CHECK_EVERY`` seconds."""
        if job_name in self._worker_tasks:
            return
        now = time.monotonic()
        if now - self._worker_tasks_read >= NAME_CHECK_EVERY:
            orphans = OrphanStore(self.pool, self.store.schema)
            try:
                self._worker_tasks = await orphans.live_tasks(NAME_CHECK_WITHIN)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                return  # a check only: the write decides whether the call fails
            self._worker_tasks_read = now
            if job_name in self._worker_tasks:
                return
        if job_name in _warned_names:
            return
        _warned_names.add(job_name)
        log.warning(
            "scheduled a job for a task no worker has registered; it waits until a "
            "worker with that task runs (a typo in the name?)",
            task=job_name,
            known=sorted(self._worker_tasks)[:20],
        )

    async def schedule_bulk(
        self,
        jobs: Any,
        conflict: Any,
        batch_size: Any,
        connection: asyncpg.Connection | None,
        positional: Any,
    ) -> list[str] | list[str | None]:
        """``schedule_bulk``: ids in input order; with ``positional``, one entry
        per spec (None where IGNORE skipped one), else the ids written."""
        check_positional(positional)
        opener = instrument.span_opener
        if opener is not None and _declares_dependencies(jobs):
            # A graph made without a current span: one trace for all of it.
            with opener("schedule graph", {"pg_scheduler.jobs": len(jobs)}, True):
                ids, written = await self.bulk(jobs, conflict, batch_size, connection)
        else:
            ids, written = await self.bulk(jobs, conflict, batch_size, connection)
        # One line per call, not per job: a bulk call may carry a million rows.
        log.debug("jobs scheduled", event_type="scheduled", count=written, bulk=True)
        if positional:
            return ids
        return [job_id for job_id in ids if job_id is not None]

    async def insert(
        self,
        db: asyncpg.Connection | asyncpg.Pool,
        rows: list[NewJob],
        conflict: ConflictResolution,
    ) -> set[str]:
        """Rows built and checked by their caller (the periodic enqueuer's
        windows, its manual runs), in one statement on ``db``: inside the
        caller's open transaction, or autocommitted on a pool. The ids written."""
        return await self._insert_for(conflict)(db, rows)  # type: ignore[no-any-return]

    # -- writing ---------------------------------------------------------------------

    async def bulk(
        self,
        jobs: list[JobSpec],
        conflict: ConflictResolution,
        batch_size: int,
        connection: asyncpg.Connection | None,
    ) -> tuple[list[str | None], int]:
        """Write many specs; (ids in input order with None for IGNORE-skipped, rows written)."""
        check_conflict_resolution(conflict)
        check_int("batch_size", batch_size, 1)
        if not isinstance(jobs, Sequence):
            raise TypeError("jobs must be a list of JobSpec")
        if any(getattr(spec, "depends_on", None) for spec in jobs):
            return await self._graph(jobs, conflict, batch_size, connection)
        if streamable(jobs):
            ids = await self._streamed(jobs, connection)
            return list(ids), len(ids)
        rows = list(self.producer.spec_rows(jobs))
        if not rows:
            return [], 0
        check_batch_keys(rows, conflict)
        user_ids = [spec.job_id for spec in jobs if spec.job_id is not None]
        if user_ids:
            await self._check_user_ids(user_ids, conflict, connection)
        written, keyed = await self._write_all(
            rows, conflict, batch_size, connection, bool(user_ids)
        )
        if conflict is not ConflictResolution.IGNORE:
            # Keyed rows: the id of the job that holds the key now (REPLACE).
            return [keyed.get(i) or row.job_id for i, row in enumerate(rows)], len(written)
        result: list[str | None] = []
        returned: set[str] = set()
        for index, row in enumerate(rows):
            got = keyed[index] if index in keyed else row.job_id
            fresh = got is not None and (got in written or index in keyed) and got not in returned
            if got is not None:
                returned.add(got)
            result.append(got if fresh else None)
        return result, len(written) + sum(1 for v in keyed.values() if v is not None)

    async def _graph(
        self,
        jobs: Sequence[JobSpec],
        conflict: ConflictResolution,
        batch_size: int,
        connection: asyncpg.Connection | None,
    ) -> tuple[list[str | None], int]:
        """Specs with dependencies: the whole graph checked, then written in one
        transaction (see ``dependencies.py``)."""
        rows = list(self.producer.spec_rows(jobs))
        graph = plan(
            rows,
            [spec.depends_on for spec in jobs],
            [spec.on_dependency_failure for spec in jobs],
            [spec.job_id is not None for spec in jobs],
            jobs,
            conflict,
        )
        ids = await self.write_graph(graph, conflict, batch_size, connection)
        return ids, sum(1 for job_id in ids if job_id is not None)

    async def _write_dependent(
        self,
        row: NewJob,
        options: JobOptions,
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
    ) -> str:
        """One job with ``depends_on`` (never started in process: it waits)."""
        user_id = options.job_id is not None
        graph = plan(
            [row], [options.depends_on], [options.on_dependency_failure], [user_id], None, conflict
        )
        await self.write_graph(graph, conflict, 1, connection)
        log.debug("job scheduled", event_type="scheduled", job_id=row.job_id, task=row.task_name)
        return row.job_id

    async def write_graph(
        self,
        graph: Graph,
        conflict: ConflictResolution,
        batch_size: int,
        connection: asyncpg.Connection | None,
    ) -> list[str | None]:
        """Write a checked graph in one transaction (a savepoint inside the
        caller's); one id per row, None where IGNORE skipped an existing id."""
        user_ids = any(graph.given)

        async def on(conn: asyncpg.Connection) -> list[str | None]:
            async with conn.transaction():
                return await self.graph.write(conn, graph, conflict, batch_size)

        if connection is not None:
            return await self._attempts(lambda: on(connection), graph.rows, user_ids, False, False)

        async def pooled() -> list[str | None]:
            async with holding(self.pool) as conn:
                return await on(conn)

        def lost() -> list[str | None]:
            return [row.job_id for row in graph.rows]

        return await self._attempts(pooled, graph.rows, user_ids, False, True, lost)

    async def _streamed(
        self, jobs: Sequence[JobSpec], connection: asyncpg.Connection | None
    ) -> list[str]:
        """Generated ids only: one COPY fed by a generator that checks and
        encodes each spec as asyncpg streams the rows, so the server inserts
        while Python prepares the rest (about 4 and 6 us of CPU per row, which
        overlap). A bad spec raises from inside the
        COPY, which aborts it: nothing is written. A retry after a lost
        connection replays the rows built so far, then builds the rest."""
        built: list[tuple[Any, ...]] = []
        pending = self.producer.spec_tuples(jobs, built)

        def stream() -> Iterator[tuple[Any, ...]]:
            return chain(built.copy(), pending)

        async def once() -> None:
            if connection is not None:
                async with connection.transaction():
                    return await self.store.copy_rows(connection, stream())
            return await autocommitted(self.pool, lambda c: self.store.copy_rows(c, stream()))

        await self._attempts(once, built, False, False, connection is None)
        return [row[0] for row in built]  # job_id

    async def _check_user_ids(
        self,
        user_ids: list[str],
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
    ) -> None:
        """Before any write: no id twice in one call, and for RAISE none already taken."""
        check_repeated_ids(user_ids, conflict)
        if conflict is ConflictResolution.RAISE:
            existing = await self.store.existing_ids(connection or self.pool, user_ids)
            check_none_existing(existing)

    async def _write_all(
        self,
        rows: list[NewJob],
        conflict: ConflictResolution,
        batch_size: int,
        connection: asyncpg.Connection | None,
        user_ids: bool,
    ) -> tuple[set[str], dict[int, str | None]]:
        """Every row of one schedule_bulk call in one transaction (a savepoint
        inside the caller's): all are written or none. Generated ids go in one
        COPY, which streams, so the server inserts while the rest are encoded;
        caller's ids in INSERT statements of ``batch_size`` rows. Rows with a
        dedupe key never go through COPY (it has no ON CONFLICT): they are
        written last, by ``KeyedWriter``. Returns the ids written without a
        key, and per keyed row (by index) the id it resolved to."""
        keyed_at = [i for i, row in enumerate(rows) if row.dedupe_key is not None]
        plain = [row for row in rows if row.dedupe_key is None] if keyed_at else rows
        keyed_rows = [rows[i] for i in keyed_at]
        steps: list[tuple[Callable[..., Any], list[NewJob]]]
        if not user_ids and len(plain) >= COPY_THRESHOLD:
            steps = [(self.store.copy_insert, plain)]
        else:
            insert = self._insert_for(conflict)
            steps = [
                (insert, plain[start : start + batch_size])
                for start in range(0, len(plain), batch_size)
            ]

        async def on(conn: asyncpg.Connection) -> tuple[set[str], dict[int, str | None]]:
            for _ in range(KEY_RACE_ATTEMPTS):
                written: set[str] = set()
                try:
                    async with conn.transaction():
                        for insert, batch in steps:
                            written |= await insert(conn, batch)
                        keyed: list[str | None] = []
                        if keyed_rows:
                            keyed = await self.keyed.write(conn, keyed_rows, conflict, user_ids)
                    return written, dict(zip(keyed_at, keyed, strict=True))
                except KeyRace:
                    continue
            raise _key_race_error()

        if connection is not None:
            return await self._attempts(lambda: on(connection), rows, user_ids, False, False)

        def lost() -> tuple[set[str], dict[int, str | None]]:
            return {r.job_id for r in plain}, {i: rows[i].job_id for i in keyed_at}

        async def pooled() -> tuple[set[str], dict[int, str | None]]:
            if len(steps) == 1 and not keyed_rows:
                # One statement is atomic on its own: no BEGIN/COMMIT round trips.
                insert, batch = steps[0]
                return await insert(self.pool, batch), {}
            async with holding(self.pool) as conn:
                return await on(conn)

        return await self._attempts(pooled, rows, user_ids, False, True, lost)

    async def write_keyed_one(
        self,
        row: NewJob,
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
        user_id: bool,
    ) -> str:
        """Write one row with a dedupe key; the id of the job that carries it:
        its own, or (IGNORE, REPLACE) the job that holds the key."""
        for _ in range(KEY_RACE_ATTEMPTS):
            _, keyed = await self._write_all([row], conflict, 1, connection, user_id)
            job_id = keyed[0]
            if job_id is not None:
                return job_id
            # IGNORE skipped it: a job with this id exists, or another holds the key.
            db = connection or self.pool
            if user_id and await self.store.existing_ids(db, [row.job_id]):
                return row.job_id
            holder = (await self.keyed.holders(db, [row])).get((row.dedupe_key, row.dedupe_scope))  # type: ignore[arg-type]
            if holder is not None:
                return holder[0]
        raise _key_race_error()

    async def write(
        self,
        rows: list[NewJob],
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
        user_ids: bool,
        retried: bool = False,
    ) -> set[str]:
        """Insert per ``conflict``; returns the ids written. RAISE -> ValueError on a duplicate.

        ``retried``: an earlier attempt at these rows lost its answer.
        """
        insert = self._insert_for(conflict)
        if not user_ids and len(rows) >= COPY_THRESHOLD:
            # Generated ids cannot collide, so no conflict handling is needed: COPY.
            insert = self.store.copy_insert

        async def once() -> set[str]:
            if connection is not None:
                # A savepoint inside the caller's transaction: a duplicate must not
                # abort the caller's work.
                async with connection.transaction():
                    return await insert(connection, rows)
            # One INSERT statement is atomic on its own: no BEGIN/COMMIT round
            # trips, and no wait for the connection's reset (pool_release).
            return await autocommitted(self.pool, lambda conn: insert(conn, rows))

        return await self._attempts(once, rows, user_ids, retried, connection is None)

    def _insert_for(self, conflict: ConflictResolution) -> Callable[..., Any]:
        return {
            ConflictResolution.RAISE: self.store.insert,
            ConflictResolution.IGNORE: self.store.insert_ignore,
            ConflictResolution.REPLACE: self.store.insert_replace,
        }[conflict]

    async def _attempts(
        self,
        once: Callable[[], Awaitable[T]],
        rows: Sequence[tuple[Any, ...]],
        user_ids: bool,
        retried: bool,
        pooled: bool,
        lost: Callable[[], T] | None = None,
    ) -> T:
        """Run ``once`` (retried on a lost pooled connection); a duplicate id or
        a held dedupe key -> ValueError.

        ``rows``: NewJobs, or the streamed COPY's plain tuples in their order.
        ``retried``: an earlier attempt at these rows lost its answer.
        ``lost``: the answer when it turns out that attempt committed (default:
        every row's id).
        """
        attempts = 0

        async def attempt() -> T:
            nonlocal attempts
            attempts += 1
            try:
                return await once()
            except asyncpg.UniqueViolationError as exc:
                again = (attempts > 1 or retried) and not user_ids
                if again and await self._all_landed(rows):
                    # Our generated ids are unique: the earlier attempt committed
                    # and only its answer was lost.
                    return lost() if lost is not None else {r[0] for r in rows}  # type: ignore[return-value]
                if is_dedupe_violation(exc):
                    named = [NewJob._make(r) for r in rows]
                    error = await self.keyed.held_error(self.pool, named, exc.detail or str(exc))
                    raise error from None
                raise duplicate_id_error(str(exc.detail or exc)) from None

        if not pooled:
            return await attempt()
        return await retry_on_disconnect(attempt, what="schedule", give_up_after=10)

    async def _all_landed(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        """After a lost answer: did every row (generated ids) get written?"""
        ids = [r[0] for r in rows]  # job_id
        return len(await self.store.existing_ids(self.pool, ids)) == len(set(ids))


def _declares_dependencies(jobs: Any) -> bool:
    """Whether a list of specs holds one with ``depends_on``."""
    return isinstance(jobs, list | tuple) and any(
        isinstance(spec, JobSpec) and spec.depends_on for spec in jobs
    )


def _key_race_error() -> ValueError:
    return ValueError(
        f"a dedupe key changed hands {KEY_RACE_ATTEMPTS} times while this write ran; "
        "nothing was scheduled, try again"
    )
