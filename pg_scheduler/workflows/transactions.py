"""Exactly-once steps: database writes committed in one transaction with
their checkpoint.

``async with ctx.transaction() as conn`` opens a transaction on a connection
of the application's pool; at the end of the block the step's record is
written in that same transaction (lease-guarded), then it commits. The
writes and the record commit together or not at all, and a place is
recorded once: two runs racing (a stale one and its successor) cannot both
commit it; the one that finds it taken rolls back and goes on as a replay.
On a replay (the record exists) the block runs again, but its transaction
is rolled back at the end: only database writes through ``conn`` belong in
the block. ``ctx.transaction_step(name, fn)`` does not even call ``fn(conn)``
on a replay and returns its stored result.

A connection lost anywhere in it (the block's statements, the record, the
commit) interrupts the run (:class:`~.errors.Interrupted`): the job is handed
back, and the next run replays it; the block runs again only if its commit
did not happen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import asyncpg

from ..store.bounded import give_back, state_unknown
from ..support.codec import decode_json
from ..support.reconnect import is_lost_while_held
from .replay import COMPLETED, Record
from .run import RunState, encode_step_result

KIND = "transaction"


async def _bounded(operation: Awaitable[Any], bound: float | None) -> Any:
    return await (operation if bound is None else asyncio.wait_for(operation, bound))


class _Open:
    """A transaction on a connection of the application's pool. Its own
    statements (the begin, the record, the commit or rollback) and the wait
    for the connection are bounded by the scheduler's ``statement_timeout``,
    as every statement of the scheduler's own: on a connection gone half-open
    they end instead of waiting for ever (docs: failure model)."""

    def __init__(self, run: RunState) -> None:
        self.run = run
        self.conn: Any = None
        self.tx: Any = None

    async def open(self) -> asyncpg.Connection:
        store = self.run.store
        try:
            self.conn = await store.raw_pool.acquire(timeout=store.timeout)
            try:
                self.tx = self.conn.transaction()
                await _bounded(self.tx.start(), store.timeout)
            except BaseException as exc:
                await self._give_back(exc)
                raise
        except Exception as exc:
            if is_lost_while_held(exc):
                raise self.run.interrupted(exc) from exc
            raise
        return self.conn

    async def close(self, commit: bool, error: BaseException | None = None) -> None:
        """Commit (or roll back), then give the connection back to the pool.

        ``error``: what ended the block. One that left the connection's state
        unknown (lost, timed out, cancelled mid-statement) closes it instead
        of a rollback: the server rolls the transaction back. A connection
        lost at the commit interrupts the run: whether the commit happened is
        for the next run to read from the records."""
        if self.conn is None:
            return
        if error is not None and state_unknown(error):
            await self._give_back(error)
            return
        bound = self.run.store.timeout
        try:
            await _bounded(self.tx.commit() if commit else self.tx.rollback(), bound)
        except Exception as exc:
            await self._give_back(exc)
            if not is_lost_while_held(exc):
                raise
            if commit:
                raise self.run.interrupted(exc) from exc
            return
        await self._give_back(None)

    async def _give_back(self, error: BaseException | None) -> None:
        """Release the connection; closed first if ``error`` left its state unknown."""
        conn, self.conn = self.conn, None
        store = self.run.store
        await give_back(store.raw_pool, conn, error, store.timeout)

    async def record(self, seq: int, name: str, key: str, result: str | None) -> bool:
        """Write the step's record in this transaction. True: written (commit);
        False: the place or the name is taken, by a run that committed it first
        (roll back, then adopt it) or at another place (adopting finds out)."""
        run = self.run
        try:
            held, written = await run.store.checkpoint(
                self.conn, run.lease, seq, KIND, name, key, COMPLETED, result, None, 1, run.now()
            )
        except asyncpg.UniqueViolationError:
            return False
        if not held:
            raise run.lost()
        return written


class TransactionStep:
    """``async with ctx.transaction(...) as conn`` (see the module docstring)."""

    def __init__(self, run: RunState, name: str, key: str) -> None:
        self._run = run
        self._name = name
        self._key = key
        self._open = _Open(run)
        self._seq = 0
        self._replayed: Record | None = None

    async def __aenter__(self) -> asyncpg.Connection:
        run = self._run
        run.check()
        self._seq, self._replayed = run.take(KIND, self._name, self._key)
        return await self._open.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        opened = self._open
        if exc_type is not None or self._replayed is not None:
            await opened.close(commit=False, error=exc)
            if isinstance(exc, Exception) and is_lost_while_held(exc):
                # A statement of the block on this connection (or the block's
                # own) lost the database: nothing committed; the run stops.
                raise self._run.interrupted(exc) from exc
            return
        try:
            written = await opened.record(self._seq, self._name, self._key, None)
        except BaseException as error:
            await opened.close(commit=False, error=error)
            if isinstance(error, Exception) and is_lost_while_held(error):
                raise self._run.interrupted(error) from error
            raise
        await opened.close(commit=written)
        if written:
            self._run.replay.keep(
                Record(self._seq, KIND, self._name, self._key, COMPLETED, None, None, 1)
            )
        else:
            await self._run.adopt(self._seq, KIND, self._name, self._key)


async def transaction_step(
    run: RunState,
    name: str,
    key: str,
    fn: Callable[[asyncpg.Connection], Awaitable[Any]],
) -> Any:
    """``fn(conn)`` in a transaction committed with its record; on a replay,
    its stored result without calling it."""
    run.check()
    seq, replayed = run.take(KIND, name, key)
    if replayed is not None:
        return replayed.result
    opened = _Open(run)
    conn = await opened.open()
    try:
        value = await fn(conn)
        text = encode_step_result(f"transaction step {name!r}", value)
        written = await opened.record(seq, name, key, text)
    except BaseException as error:
        await opened.close(commit=False, error=error)
        if isinstance(error, Exception) and is_lost_while_held(error):
            raise run.interrupted(error) from error
        raise
    await opened.close(commit=written)
    if not written:
        return (await run.adopt(seq, KIND, name, key)).result
    made = Record(seq, KIND, name, key, COMPLETED, decode_json(text), None, 1)
    run.replay.keep(made)
    return made.result
