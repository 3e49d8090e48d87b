"""Sending signals to workflows (``Scheduler.signal``, ``Scheduler.signal_bulk``,
``SyncClient.signal``).

One statement for one signal (store/signal_sql.py): the job's row is locked,
the signal stored; a workflow parked waiting for that name is made pending at
once (with a NOTIFY), the signal bound to its wait and the wait's record
completed. A signal sent before the workflow waits for it is kept until a
wait takes it. A signal to an unknown or finished job is refused, and nothing
is written. Many signals: one transaction of two statements, all or none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import asyncpg

from ..store.workflows import WorkflowStore
from ..support.codec import encode_json, encode_task_data
from ..support.validation import check_name


async def send_signal(
    store: WorkflowStore,
    job_id: str,
    name: str,
    payload: Any = None,
    connection: asyncpg.Connection | None = None,
) -> None:
    """Signal ``name`` with ``payload`` (JSON) to workflow ``job_id``.

    Raises :class:`~pg_scheduler.JobNotFound` (a LookupError) for an unknown
    job, ValueError for a finished one, TypeError/ValueError for a bad name
    or payload (nothing written). With ``connection``, inside the caller's
    transaction: the signal exists, and wakes the workflow, only if it commits.
    Not retried after a lost connection (a signal that landed would be sent
    twice): the caller sees the error.
    """
    text = _checked(job_id, name, payload)
    row = await store.signal(connection or store.pool, job_id, name, text)
    if row is None:
        raise _not_found(job_id)
    if row["signal_id"] is None:
        raise _finished(job_id, row["status"])


async def send_signals(
    store: WorkflowStore,
    signals: Iterable[tuple[str, str] | tuple[str, str, Any]],
    connection: asyncpg.Connection | None = None,
) -> int:
    """Send every ``(job_id, name[, payload])`` of ``signals``, in order, in
    one transaction: all are stored, or none (an unknown job raises
    :class:`~pg_scheduler.JobNotFound`, a finished one ValueError, a bad
    item TypeError/ValueError, before anything is written). Returns how many
    workflows were waiting for theirs and were woken. With ``connection``,
    inside the caller's transaction (its rows stay locked until it ends)."""
    if isinstance(signals, (str, bytes)) or not isinstance(signals, Iterable):
        raise TypeError(
            f"signals must be an iterable of (job_id, name[, payload]) tuples, got {signals!r}"
        )
    job_ids: list[str] = []
    names: list[str] = []
    payloads: list[str | None] = []
    for i, item in enumerate(signals):
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise TypeError(
                f"signals[{i}] must be a (job_id, name) or (job_id, name, payload) tuple, "
                f"got {item!r}"
            )
        job_id, name = item[0], item[1]
        payloads.append(_checked(job_id, name, item[2] if len(item) == 3 else None))
        job_ids.append(job_id)
        names.append(name)
    if not job_ids:
        return 0
    if connection is not None:
        if connection.is_in_transaction():  # the caller's: it commits or rolls back
            return await _send_all(store, connection, job_ids, names, payloads)
        async with connection.transaction():  # ours: the two statements as one
            return await _send_all(store, connection, job_ids, names, payloads)
    async with store.pool.acquire() as conn, conn.transaction():
        return await _send_all(store, conn, job_ids, names, payloads)


async def _send_all(
    store: WorkflowStore,
    conn: asyncpg.Connection,
    job_ids: list[str],
    names: list[str],
    payloads: list[str | None],
) -> int:
    refused = await store.signal_check(conn, job_ids)
    if refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more refused)" if len(refused) > 1 else ""
        if first["status"] is None:
            raise _not_found(first["job_id"], more)
        raise _finished(first["job_id"], first["status"], more)
    row = await store.signal_many(conn, job_ids, names, payloads)
    return int(row["woken"])


def _checked(job_id: Any, name: Any, payload: Any) -> str | None:
    """The payload as stored JSON, after every check of one signal."""
    if not isinstance(job_id, str) or not job_id:
        raise TypeError(f"job_id must be a non-empty str, got {job_id!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"signal name must be a non-empty str, got {name!r}")
    check_name("signal name", name)
    # The same checks as a job's arguments (JSON, NUL, lone surrogates, depth).
    encode_task_data([payload], {}, f"signal {name!r}")
    return None if payload is None else encode_json(payload)


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
