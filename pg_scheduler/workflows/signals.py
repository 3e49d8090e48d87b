"""Sending a signal to a workflow (``Scheduler.signal``, ``SyncClient.signal``).

One statement (store/workflows.py): the job's row is locked, the signal
stored; a workflow parked waiting for that name is made pending at once (with
a NOTIFY) and the signal bound to its wait. A signal sent before the
workflow waits for it is kept until a wait takes it. A signal to an unknown
or finished job is refused, and nothing is written.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ..api.results import JobNotFound
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
    if not isinstance(job_id, str) or not job_id:
        raise TypeError(f"job_id must be a non-empty str, got {job_id!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"signal name must be a non-empty str, got {name!r}")
    check_name("signal name", name)
    # The same checks as a job's arguments (JSON, NUL, lone surrogates, depth).
    encode_task_data([payload], {}, f"signal {name!r}")
    text = None if payload is None else encode_json(payload)
    row = await store.signal(connection or store.pool, job_id, name, text)
    if row is None:
        raise JobNotFound(job_id)
    if row["signal_id"] is None:
        raise ValueError(f"job {job_id} is {row['status']}: a finished job takes no signal")
