"""Parking: ``ctx.sleep`` and ``ctx.wait_for_signal``.

A parked workflow's row is ``waiting``: no worker, no lease, no slot, no
connection. The run ends (:class:`~.errors.Parked`); a later run replays the
workflow up to the same place, where the wait is over by then (or parks
again, if it woke early). Times are the database's: a sleep's end is
``now() + delay`` in SQL, recorded with its step, so a replay waits for the
same instant.

Waiting for a signal locks the run's row, then looks for the signal in a new
statement, then parks (store/workflows.py explains why no signal is lost).
A signal sent before the wait is taken by it; of several, the oldest; each
wait takes one.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..support.codec import decode_json, encode_json
from .replay import COMPLETED, WAITING, Record
from .run import RunState


def _until(record: Record) -> datetime | None:
    value = (record.result or {}).get("until")
    return None if value is None else datetime.fromisoformat(value)


async def sleep(run: RunState, seconds: float | None, until: datetime | None) -> None:
    """Park until ``seconds`` from now (database clock) or ``until``."""
    run.check()
    key = str(run.replay.next_seq)
    seq, record = run.take("sleep", "sleep", key)
    if record is not None:
        until = _until(record)
        if until is not None and until <= run.now():
            return
    started = run.now()
    row = await run.write(
        lambda c: run.store.park_sleep(
            c, run.lease, seq, "sleep", key, until, seconds or 0.0, run.lookahead, started
        )
    )
    if row is None:
        raise run.lost()
    over = row["how"] == "over"
    status = COMPLETED if over or row["how"] == "soon" else WAITING
    run.replay.keep(
        Record(seq, "sleep", "sleep", key, status, {"until": row["until"].isoformat()}, None, 1)
    )
    if row["wake"] < row["until"] and over:
        raise run.halt(run.deadline_passed())
    if over:
        return
    raise run.parked()


async def wait_for_signal(
    run: RunState, signal: str, key: str | None, timeout: float | None
) -> tuple[bool, Any]:
    """(True, payload) when a signal ``signal`` came; (False, None) on timeout."""
    run.check()
    key = key if key is not None else str(run.replay.next_seq)
    seq, record = run.take("signal", signal, key)
    if record is not None and record.status == COMPLETED:
        result = record.result or {}
        return ("timeout" not in result), result.get("payload")
    until = None if record is None else _until(record)
    started = run.now()
    store, lease = run.store, run.lease
    async with run.locked() as (conn, locked):
        db_now: datetime = locked["db_now"]
        if record is None and timeout is not None:
            until = db_now + timedelta(seconds=timeout)
        got = await store.take_signal(conn, lease.job_id, seq, signal)
        outcome: Any = None
        if got is not None:
            outcome = {"payload": decode_json(got["payload"])}
        elif until is not None and until <= db_now:
            outcome = {"timeout": True}
        if outcome is not None:
            text = encode_json(outcome)
            held, _ = await store.finish_wait(
                conn, lease, seq, "signal", signal, key, text, started
            )
            if not held:
                raise run.lost()
            run.replay.keep(Record(seq, "signal", signal, key, COMPLETED, outcome, None, 1))
            return ("timeout" not in outcome), outcome.get("payload")
        deadline = locked["workflow_deadline"]
        if deadline is not None and deadline <= db_now:
            raise run.halt(run.deadline_passed())
        wake = min((t for t in (until, deadline) if t is not None), default=None)
        soon = wake is not None and wake <= db_now + timedelta(seconds=run.lookahead)
        parked = await store.park(
            conn,
            lease,
            seq,
            "signal",
            signal,
            key,
            encode_json({"until": None if until is None else until.isoformat()}),
            "signal",
            signal,
            wake,
            soon,
            None,
            started,
        )
        if parked is None:
            raise run.lost()
    raise run.parked()
