"""Writing rows that carry a dedupe key, per conflict policy.

The partial unique indexes of migrations 0008 and 0013 decide who holds a key; this
module only chooses what to do when a key is taken. Rows are written inside
the caller's transaction (``Enqueuer`` opens it), so a bulk call stays all or
nothing. Within one batch, one row per (key, scope) goes to the database:
RAISE refuses duplicates before anything is written, IGNORE keeps the first,
REPLACE the last.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..enums import ConflictResolution
from ..store import NewJob, Store
from ..store.dedupe import DEDUPE_INDEXES, DedupeStore

Key = tuple[str, str]  # (dedupe_key, dedupe_scope)


class KeyRace(Exception):
    """A key changed hands between two statements of one write: try it again."""


def key_of(row: NewJob) -> Key:
    assert row.dedupe_key is not None and row.dedupe_scope is not None
    return row.dedupe_key, row.dedupe_scope


def is_dedupe_violation(exc: asyncpg.UniqueViolationError) -> bool:
    return getattr(exc, "constraint_name", None) in DEDUPE_INDEXES


def check_batch_keys(rows: Sequence[NewJob], conflict: ConflictResolution) -> None:
    """RAISE: ValueError (before any write) if a key repeats within the batch."""
    if conflict is not ConflictResolution.RAISE:
        return
    seen: set[Key] = set()
    repeated: set[Key] = set()
    for row in rows:
        if row.dedupe_key is not None:
            key = key_of(row)
            if key in seen:
                repeated.add(key)
            seen.add(key)
    if repeated:
        shown = ", ".join(f"{k!r} (scope {s})" for k, s in sorted(repeated)[:10])
        raise ValueError(
            f"dedupe keys repeated within one schedule_bulk call: {shown}; nothing was "
            "scheduled (IGNORE keeps the first of each, REPLACE the last)"
        )


def _by_scope(rows: Sequence[NewJob]) -> dict[str, list[NewJob]]:
    scopes: dict[str, list[NewJob]] = {}
    for row in rows:
        scopes.setdefault(key_of(row)[1], []).append(row)
    return scopes


class KeyedWriter:
    """Writes keyed rows through one connection, inside its open transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dedupe = DedupeStore(store.qualify)

    async def holders(
        self, db: asyncpg.Connection | asyncpg.Pool, rows: Sequence[NewJob]
    ) -> dict[Key, tuple[str, str]]:
        """(key, scope) -> (job id, status) of the job holding each row's key now."""
        found: dict[Key, tuple[str, str]] = {}
        for scope, jobs in _by_scope(rows).items():
            held = await self.dedupe.holders(db, scope, [str(j.dedupe_key) for j in jobs])
            found.update(((key, scope), holder) for key, holder in held.items())
        return found

    async def held_error(
        self, db: asyncpg.Connection | asyncpg.Pool, rows: Sequence[NewJob], detail: str = ""
    ) -> ValueError:
        """The error RAISE gives for ``rows`` whose keys are taken."""
        held = await self.holders(db, [r for r in rows if r.dedupe_key is not None])
        if not held:
            return ValueError(
                f"dedupe key already held: {detail}; nothing was scheduled "
                "(use ConflictResolution.IGNORE or REPLACE to allow this)"
            )
        shown = ", ".join(
            f"{k!r} (scope {s}) by job {job_id} ({status})"
            for (k, s), (job_id, status) in sorted(held.items())[:10]
        )
        return ValueError(
            f"dedupe key already held: {shown}; nothing was scheduled "
            "(use ConflictResolution.IGNORE or REPLACE to allow this)"
        )

    async def write(
        self,
        conn: asyncpg.Connection,
        rows: Sequence[NewJob],
        conflict: ConflictResolution,
        user_ids: bool,
    ) -> list[str | None]:
        """Write keyed ``rows``; per row, the id of the job that now carries it
        (its own, or the holder's), None for a row IGNORE skipped."""
        groups: dict[Key, list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(key_of(row), []).append(index)
        last = conflict is ConflictResolution.REPLACE
        chosen = {key: rows[g[-1] if last else g[0]] for key, g in groups.items()}
        picked = list(chosen.values())
        if conflict is ConflictResolution.RAISE:
            check_batch_keys(rows, conflict)
            if await self.holders(conn, picked):
                raise await self.held_error(conn, picked)
            # A race the look-up missed still hits the index: UniqueViolationError.
            await self.store.insert(conn, picked)
            outcome: dict[Key, str | None] = {k: r.job_id for k, r in chosen.items()}
        elif conflict is ConflictResolution.IGNORE:
            inserted = await self.store.insert_ignore(conn, picked)
            outcome = {k: r.job_id if r.job_id in inserted else None for k, r in chosen.items()}
        else:
            outcome = await self._replace(conn, picked, user_ids)
        result: list[str | None] = [None] * len(rows)
        for key, indexes in groups.items():
            # IGNORE: later duplicates in the batch were skipped.
            for index in indexes if last else indexes[:1]:
                result[index] = outcome[key]
        if conflict is ConflictResolution.RAISE:
            result = [r.job_id for r in rows]
        return result

    async def _replace(
        self, conn: asyncpg.Connection, rows: list[NewJob], user_ids: bool
    ) -> dict[Key, str | None]:
        """A pending holder takes the new fields and keeps its id; a free key
        gets a new row; a running or parked holder (scope active) is left alone
        and its id returned."""
        outcome: dict[Key, str | None] = {}
        for scope, jobs in _by_scope(rows).items():
            replaced = await self.dedupe.replace_pending(conn, scope, jobs)
            outcome.update(((key, scope), job_id) for key, job_id in replaced.items())
        rest = [r for r in rows if key_of(r) not in outcome]
        if not rest:
            return outcome
        inserted = await self.store.insert_ignore(conn, rest)
        outcome.update((key_of(r), r.job_id) for r in rest if r.job_id in inserted)
        left = [r for r in rest if r.job_id not in inserted]
        if not left:
            return outcome
        existing: set[str] = set()
        if user_ids:
            existing = set(await self.store.existing_ids(conn, [r.job_id for r in left]))
        by_id = [r for r in left if r.job_id in existing]
        if by_id:
            # The caller's id exists and the key was free: REPLACE by job id.
            await self.store.insert_replace(conn, by_id)
            outcome.update((key_of(r), r.job_id) for r in by_id)
        others = [r for r in left if r.job_id not in existing]
        held = await self.holders(conn, others)
        for row in others:
            holder = held.get(key_of(row))
            if holder is None or holder[1] not in ("running", "waiting"):
                # Freed, or a pending holder appeared after our update: again.
                raise KeyRace(row.dedupe_key)
            outcome[key_of(row)] = holder[0]
        return outcome
