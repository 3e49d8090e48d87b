"""Sending signals to workflows (``Scheduler.signal``, ``Scheduler.signal_bulk``,
``SyncClient.signal``).

One statement for one signal (store/signal_sql.py): the job's row is locked,
the signal stored; a workflow parked waiting for that name is made pending at
once (with a NOTIFY), the signal bound to its wait and the wait's record
completed. A signal sent before the workflow waits for it is kept until a
wait takes it. A signal to an unknown or finished job is refused, and nothing
is written. Many signals: one transaction of two statements, all or none.

A signal may carry an idempotency key: sent again with the same key, to the
same job, it changes nothing (the first one stands), also once the job has
finished. Such a send, on the scheduler's own pool, is retried when its
connection is lost before the answer: it cannot land twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Iterable
from typing import Any, TypeVar, cast

import asyncpg

from ..enums import FINAL_STATUS_VALUES
from ..store.dbapi import DbapiStatements, dbapi_connection
from ..store.workflows import WorkflowStore
from ..support.codec import encode_json, encode_task_data
from ..support.reconnect import retry_on_disconnect
from ..support.validation import MAX_NAME_BYTES, check_name

#: How long a send with an idempotency key waits for an unreachable database
#: (seconds), retrying, before the error reaches its caller.
RESEND_PATIENCE = 10.0

T = TypeVar("T")
Signal = tuple[str, str] | tuple[str, str, Any] | tuple[str, str, Any, str | None]


# The logic of a send, written once for both drivers: a generator that yields
# the statement it needs as (WorkflowStore / DbapiStatements method, its
# arguments after the connection) and is sent the answer; _run drives it on
# asyncpg, run_dbapi on a caller's psycopg connection.
Ask = tuple[str, tuple[Any, ...]]
Plan = Generator[Ask, Any, T]


async def send_signal(
    store: WorkflowStore,
    job_id: str,
    name: str,
    payload: Any = None,
    connection: asyncpg.Connection | None = None,
    idempotency_key: str | None = None,
) -> bool:
    """Signal ``name`` with ``payload`` (JSON) to workflow ``job_id``. True
    when stored; False when the job already has a signal of
    ``idempotency_key`` (nothing written).

    Raises :class:`~pg_scheduler.JobNotFound` (a LookupError) for an unknown
    job, ValueError for a finished one (unless it has this key's signal),
    TypeError/ValueError for a bad name, payload or key (nothing written).
    With ``connection``, inside the caller's transaction: the signal exists,
    and wakes the workflow, only if it commits. Without a key, not retried
    after a lost connection (a signal that landed would be sent twice): the
    caller sees the error. With one, on the scheduler's pool, retried for up
    to :data:`RESEND_PATIENCE` seconds.
    """
    text = checked_signal(job_id, name, payload)
    key = checked_key(idempotency_key)
    if connection is not None:
        return await _run(store, connection, one_signal(job_id, name, text, key))
    if key is None:
        return await _run(store, store.pool, one_signal(job_id, name, text, key))
    return await retry_on_disconnect(
        lambda: _run(store, store.pool, one_signal(job_id, name, text, key)),
        what="signal",
        give_up_after=RESEND_PATIENCE,
    )


def one_signal(job_id: str, name: str, text: str | None, key: str | None) -> Plan[bool]:
    """One checked signal: True stored, False a repeat of its key."""
    row = yield ("signal", (job_id, name, text, key))
    if row is None:
        raise _not_found(job_id)
    if row["signal_id"] is not None:
        return True
    if row["status"] not in FINAL_STATUS_VALUES:
        return False  # its key is stored: a repeat
    if key is not None and (yield ("signal_kept", ([job_id], [key]))):
        return False  # a repeat of a signal it had before it finished
    raise _finished(job_id, row["status"])


async def send_signals(
    store: WorkflowStore,
    signals: Iterable[Signal],
    connection: asyncpg.Connection | None = None,
) -> int:
    """Send every ``(job_id, name[, payload[, idempotency_key]])`` of
    ``signals``, in order, in one transaction: all are stored, or none (an
    unknown job raises :class:`~pg_scheduler.JobNotFound`, a finished one
    ValueError, a bad item TypeError/ValueError, before anything is written).
    A signal whose key its job has already (or an earlier item of the batch
    has) is left out, and a finished job is not refused for such repeats.
    Returns how many workflows were waiting for theirs and were woken by this
    call. With ``connection``, inside the caller's transaction (its rows stay
    locked until it ends). When every item has a key, a send on the
    scheduler's pool is retried after a lost connection, as
    :func:`send_signal`."""
    batch = SignalBatch.of(signals)
    if not batch.job_ids:
        return 0
    if connection is not None:
        if connection.is_in_transaction():  # the caller's: it commits or rolls back
            return await _run(store, connection, many_signals(batch))
        async with connection.transaction():  # ours: the two statements as one
            return await _run(store, connection, many_signals(batch))

    async def send() -> int:
        async with store.pool.acquire() as conn, conn.transaction():
            return await _run(store, conn, many_signals(batch))

    if None in batch.keys:
        return await send()
    return await retry_on_disconnect(send, what="signal_bulk", give_up_after=RESEND_PATIENCE)


class SignalBatch:
    """Checked signals, in order, without the repeats of a (job, key) pair."""

    def __init__(self) -> None:
        self.job_ids: list[str] = []
        self.names: list[str] = []
        self.payloads: list[str | None] = []
        self.keys: list[str | None] = []
        self._seen: set[tuple[str, str]] = set()

    @classmethod
    def of(cls, signals: Any) -> SignalBatch:
        """``signals`` checked: TypeError/ValueError for the first bad item."""
        if isinstance(signals, (str, bytes)) or not isinstance(signals, Iterable):
            raise TypeError(
                "signals must be an iterable of (job_id, name[, payload[, idempotency_key]]) "
                f"tuples, got {signals!r}"
            )
        batch = cls()
        for i, item in enumerate(signals):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3, 4):
                raise TypeError(
                    f"signals[{i}] must be a (job_id, name[, payload[, idempotency_key]]) "
                    f"tuple, got {item!r}"
                )
            job_id, name = item[0], item[1]
            text = checked_signal(job_id, name, item[2] if len(item) > 2 else None)
            batch.add(job_id, name, text, checked_key(item[3] if len(item) == 4 else None))
        return batch

    def add(self, job_id: str, name: str, payload: str | None, key: str | None) -> None:
        if key is not None:
            if (job_id, key) in self._seen:
                return  # the batch's first signal of this key stands
            self._seen.add((job_id, key))
        self.job_ids.append(job_id)
        self.names.append(name)
        self.payloads.append(payload)
        self.keys.append(key)

    def without(self, job_ids: set[str]) -> SignalBatch:
        """A copy without the signals to ``job_ids``."""
        rest = SignalBatch()
        for i, job_id in enumerate(self.job_ids):
            if job_id not in job_ids:
                rest.add(job_id, self.names[i], self.payloads[i], self.keys[i])
        return rest


def many_signals(batch: SignalBatch) -> Plan[int]:
    """A batch's two statements (in one transaction): how many were woken."""
    refused = yield ("signal_check", (batch.job_ids,))
    if refused:
        repeats = yield from _only_repeats(batch, refused)
        refused = [row for row in refused if row["job_id"] not in repeats]
        if refused:
            first = refused[0]
            more = f" (and {len(refused) - 1} more refused)" if len(refused) > 1 else ""
            if first["status"] is None:
                raise _not_found(first["job_id"], more)
            raise _finished(first["job_id"], first["status"], more)
        batch = batch.without(repeats)  # a copy: a retry of the call starts from the whole
        if not batch.job_ids:
            return 0
    row = yield ("signal_many", (batch.job_ids, batch.names, batch.payloads, batch.keys))
    return int(row["woken"])


def _only_repeats(batch: SignalBatch, refused: list[Any]) -> Plan[set[str]]:
    """The finished jobs of ``refused`` whose every signal in ``batch`` is a
    repeat of one they have (by its key): not refused, their signals left out."""
    finished = {row["job_id"] for row in refused if row["status"] is not None}
    pairs = [
        (job_id, key)
        for job_id, key in zip(batch.job_ids, batch.keys, strict=True)
        if job_id in finished
    ]
    keyed = [(job_id, key) for job_id, key in pairs if key is not None]
    if not keyed:
        return set()
    kept = yield ("signal_kept", ([p[0] for p in keyed], [p[1] for p in keyed]))
    return finished - {job_id for job_id, key in pairs if key is None or (job_id, key) not in kept}


def run_dbapi(statements: DbapiStatements, conn: Any, plan: Plan[T]) -> T:
    """Answer ``plan``'s statements on a caller's psycopg connection, all or
    nothing in the caller's transaction (a savepoint) or in one of its own
    on an autocommit connection (:meth:`DbapiStatements.atomically`).
    ``conn`` may be SQLAlchemy's pooled proxy of one."""
    conn = dbapi_connection(conn)

    def work() -> T:
        try:
            method, args = next(plan)
            while True:
                method, args = plan.send(getattr(statements, method)(conn, *args))
        except StopIteration as done:
            return cast(T, done.value)

    return cast(T, statements.atomically(conn, work))


async def _run(store: WorkflowStore, db: asyncpg.Connection | asyncpg.Pool, plan: Plan[T]) -> T:
    """Answer ``plan``'s statements on ``db`` (asyncpg) until it returns."""
    try:
        method, args = next(plan)
        while True:
            answer = await getattr(store, method)(db, *args)
            method, args = plan.send(answer)
    except StopIteration as done:
        return cast(T, done.value)


def checked_signal(job_id: Any, name: Any, payload: Any) -> str | None:
    """The payload as stored JSON, after every check of one signal."""
    if not isinstance(job_id, str) or not job_id:
        raise TypeError(f"job_id must be a non-empty str, got {job_id!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"signal name must be a non-empty str, got {name!r}")
    check_name("signal name", name)
    # The same checks as a job's arguments (JSON, NUL, lone surrogates, depth).
    encode_task_data([payload], {}, f"signal {name!r}")
    return None if payload is None else encode_json(payload)


def own_signal_key(job_id: str, seq: int) -> str:
    """The idempotency key of the signal workflow ``job_id`` sends at step
    ``seq`` (``ctx.signal``): ``workflow:<job id>:<seq>``, or with the id's
    SHA-256 in its place when that would pass the keys' length limit."""
    key = f"workflow:{job_id}:{seq}"
    if len(key.encode()) <= MAX_NAME_BYTES:
        return key
    return f"workflow-sha256:{hashlib.sha256(job_id.encode()).hexdigest()}:{seq}"


def checked_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise TypeError(f"idempotency_key must be a non-empty str or None, got {key!r}")
    check_name("idempotency_key", key)
    return key


def _not_found(job_id: str, more: str = "") -> LookupError:
    # The results API's error for an unknown id (api/ sits above the engine,
    # which imports this wing: not imported with this module).
    from ..api.results import JobNotFound

    error = JobNotFound(job_id)
    if more:
        error.args = (f"{error.args[0] if error.args else job_id}{more}",)
    return error


def _finished(job_id: str, status: str, more: str = "") -> ValueError:
    return ValueError(f"job {job_id} is {status}: a finished job takes no signal{more}")
