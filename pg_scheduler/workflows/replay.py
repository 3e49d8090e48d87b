"""Replay: a run's recorded steps, and matching each context call against them.

Every call of the context that records something (a step, a transaction, a
sleep, a signal wait, a spawn, a wait for children) takes the next sequence
number, 1, 2, 3, ... in the order the workflow reaches them. Its record, if
the workflow reached that place before, must be of the same kind, name and
key: anything else means the code changed under a running workflow, and the
job fails with :class:`~.errors.WorkflowMismatch` rather than run a step
again or skip one silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..store.workflows import StepRow
from .errors import DuplicateStep, WorkflowMismatch

COMPLETED, FAILED, WAITING = "completed", "failed", "waiting"


@dataclass(slots=True)
class Record:
    """One row of ``workflow_steps`` (``result`` decoded)."""

    seq: int
    kind: str
    name: str
    key: str
    status: str
    result: Any
    error: str | None
    attempts: int


def record_of(row: StepRow) -> Record:
    """A step as read (``store.workflows.StepRow``), JSON decoded. A spawn step
    whose child's row is final reads as over, with that row's outcome (what
    the database copies onto the step once the row goes: migration 0016)."""
    seq, kind, name, key, status, result, error, attempts, spawned_id = row[:9]
    if spawned_id is None:
        return Record(
            seq, kind, name, key, status, None if result is None else json.loads(result),
            error, attempts,
        )  # fmt: skip
    value: dict[str, Any] = {"job_id": spawned_id, "detached": bool(row[9])}
    if row[10] is not None:
        child_result = row[11]
        value["outcome"] = {
            "status": row[10],
            "result": None if child_result is None else json.loads(child_result),
            "error": row[12],
        }
        status = COMPLETED
    return Record(seq, kind, name, key, status, value, error, attempts)


def describe(kind: str, name: str, key: str) -> str:
    return f"{kind} {name!r}" + (f" (key {key!r})" if key else "")


class Replay:
    """The records of one job and the place the run has reached among them."""

    __slots__ = ("_names", "next_seq", "records")

    def __init__(self, rows: Iterable[StepRow]) -> None:
        self.records: dict[int, Record] = {row[0]: record_of(row) for row in rows}
        self.next_seq = 1
        self._names: set[tuple[str, str]] = set()

    @property
    def last_seq(self) -> int:
        return max(self.records, default=0)

    def take(self, kind: str, name: str, key: str) -> tuple[int, Record | None]:
        """The next place, and what was recorded there (None: nothing yet)."""
        ident = (name, key)
        if ident in self._names:
            raise DuplicateStep(
                f"{describe(kind, name, key)} is used twice in this workflow; "
                "give each step a name of its own, or a key= (steps in a loop)"
            )
        seq = self.next_seq
        record = self.records.get(seq)
        if record is not None and (record.kind, record.name, record.key) != (kind, name, key):
            raise WorkflowMismatch(
                f"step {seq} of this workflow was recorded as "
                f"{describe(record.kind, record.name, record.key)} but the code now reaches "
                f"{describe(kind, name, key)} there; the workflow's code changed while it ran. "
                "Finish or cancel workflows started by the old code before changing the "
                "order or names of their steps"
            )
        self._names.add(ident)
        self.next_seq = seq + 1
        return seq, record

    def keep(self, record: Record) -> None:
        self.records[record.seq] = record

    def is_last(self, seq: int) -> bool:
        """Nothing was recorded after ``seq``."""
        return all(other <= seq for other in self.records)

    def left_over(self) -> list[Record]:
        """Records past the place the run reached (checked when it returns)."""
        return [r for seq, r in sorted(self.records.items()) if seq >= self.next_seq]
