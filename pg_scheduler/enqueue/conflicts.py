"""The rules for job ids and conflict policies that every enqueue path shares
(``schedule``, ``schedule_bulk``, the sync client): checked before anything is
written."""

from __future__ import annotations

from typing import Any

from ..enums import ConflictResolution
from ..store import NewJob


def check_conflict_resolution(value: Any) -> None:
    if not isinstance(value, ConflictResolution):
        raise TypeError(f"conflict_resolution must be a ConflictResolution, got {value!r}")


def check_repeated_ids(user_ids: list[str], conflict: ConflictResolution) -> None:
    seen: set[str] = set()
    duplicates: set[str] = set()
    for i in user_ids:
        if i in seen:
            duplicates.add(i)
        seen.add(i)
    if duplicates and conflict is not ConflictResolution.IGNORE:
        raise ValueError(
            f"job ids repeated within one schedule_bulk call: {sorted(duplicates)[:10]}"
        )


def check_none_existing(existing: list[str]) -> None:
    if existing:
        raise ValueError(
            f"job ids already exist: {sorted(existing)[:10]}; nothing "
            "was scheduled (use IGNORE or REPLACE to allow this)"
        )


def duplicate_id_error(detail: str) -> ValueError:
    return ValueError(
        f"Job ID already exists: {detail}. Choose a different job_id, "
        "omit it for auto-generation, or use ConflictResolution.IGNORE/REPLACE"
    )


def ids_in_order(
    rows: list[NewJob], written: set[str], conflict: ConflictResolution
) -> list[str | None]:
    """One id per row, None where IGNORE skipped it (or an earlier row had its id)."""
    if conflict is not ConflictResolution.IGNORE:
        return [row.job_id for row in rows]
    result: list[str | None] = []
    returned: set[str] = set()
    for row in rows:
        fresh = row.job_id in written and row.job_id not in returned
        returned.add(row.job_id)
        result.append(row.job_id if fresh else None)
    return result
