"""Jobs with declared dependencies (``depends_on=``): a graph checked whole,
then written in one transaction.

:func:`plan` (no database) resolves each job's ``depends_on`` to ids (a
``JobSpec`` of the same ``schedule_bulk`` call by identity, a string as a job
id: one of the call's, or an existing job), drops repeats, and refuses a
cycle, a dependency on itself, a dedupe key or REPLACE: a clear
ValueError/TypeError before anything is written. :class:`GraphWriter` then
writes the graph (see ``store/dependencies.py``): the existing jobs depended
on are locked and their status read (one that does not exist is a
ValueError, and the transaction writes nothing), the rows, their edges, and
the policy of a dependency that had already ended without completing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ..enums import FINAL_STATUS_VALUES, ConflictResolution, JobStatus
from ..job_spec import JobSpec
from ..store import NewJob, Store
from ..store.dependencies import WAIT_KIND, DependencyStore
from .checks import check_depends_on, check_on_dependency_failure
from .conflicts import check_none_existing, check_repeated_ids
from .rows import COPY_THRESHOLD

_COMPLETED = JobStatus.COMPLETED.value
_ENDED_OTHERWISE = frozenset(FINAL_STATUS_VALUES) - {_COMPLETED}


@dataclass
class Graph:
    """Checked rows and their dependencies, ready to write."""

    rows: list[NewJob]
    #: Per row: the ids it depends on, in declared order, without repeats.
    depends_on: list[list[str]]
    policies: list[str]
    #: Whether the caller gave each row's id (IGNORE may skip those).
    given: list[bool]
    index_of: dict[str, int] = field(default_factory=dict)


def plan(
    rows: list[NewJob],
    depends_on: Sequence[Any],
    policies: Sequence[Any],
    given: Sequence[bool],
    specs: Sequence[Any] | None,
    conflict: ConflictResolution,
) -> Graph:
    """The graph of ``rows`` (``depends_on[i]``, ``policies[i]``: row i's;
    ``specs``: schedule_bulk's JobSpecs, for references by spec; None for
    ``schedule()``, which takes ids only). Raises before any write."""
    if conflict is ConflictResolution.REPLACE:
        raise ValueError(
            "depends_on cannot be combined with ConflictResolution.REPLACE "
            "(a job that others wait for is not rewritten); use RAISE or IGNORE"
        )
    user_ids = [row.job_id for row, mine in zip(rows, given, strict=True) if mine]
    check_repeated_ids(user_ids, conflict)
    index_of: dict[str, int] = {}
    for index, row in enumerate(rows):
        index_of.setdefault(row.job_id, index)
        if row.dedupe_key is not None:
            raise ValueError(
                f"a dedupe key cannot be combined with depends_on (job {_named(row, index)} "
                f"has dedupe key {row.dedupe_key!r}); schedule keyed jobs apart"
            )
    spec_index = {id(spec): i for i, spec in enumerate(specs)} if specs is not None else {}
    resolved: list[list[str]] = []
    checked_policies: set[Any] = set()
    # Every dependency inside the call earlier in it: no cycle (the common
    # case: a spec can only name a spec made before it, unless changed later).
    ordered = True
    for index, (row, deps, policy) in enumerate(zip(rows, depends_on, policies, strict=True)):
        if policy not in checked_policies:
            check_on_dependency_failure(policy)
            checked_policies.add(policy)
        if not deps:
            resolved.append([])
            continue
        check_depends_on(deps)
        ids: list[str] = []
        for dep in deps:
            if type(dep) is JobSpec:  # the common case first: a spec of the call
                at = spec_index.get(id(dep))
                if at is None:
                    raise _foreign_spec(index, bool(spec_index))
                ids.append(rows[at].job_id)
            else:
                dep_id = _dependency_id(dep, spec_index, rows, index)
                at = index_of.get(dep_id)
                ids.append(dep_id)
            if at is not None and at >= index:
                ordered = False
        if len(set(ids)) != len(ids):  # repeats: keep each first mention
            ids = list(dict.fromkeys(ids))
        if row.job_id in ids:
            raise ValueError(f"job {_named(row, index)} depends on itself; nothing was scheduled")
        resolved.append(ids)
    graph = Graph(rows, resolved, list(policies), list(given), index_of)
    if not ordered:
        _refuse_cycles(graph)
    return graph


def _named(row: NewJob, index: int) -> str:
    return f"{row.job_id} ({row.task_name}, jobs[{index}])"


def _dependency_id(dep: Any, spec_index: dict[int, int], rows: list[NewJob], index: int) -> str:
    if isinstance(dep, str):
        return dep
    if isinstance(dep, JobSpec):
        at = spec_index.get(id(dep))
        if at is None:
            raise _foreign_spec(index, bool(spec_index))
        return rows[at].job_id
    raise TypeError(f"depends_on must hold job ids (or JobSpecs), got {type(dep).__name__}")


def _foreign_spec(index: int, bulk: bool) -> Exception:
    """A JobSpec in depends_on that is not one of the call's."""
    if not bulk:
        return TypeError(
            "depends_on of schedule() takes job ids; a JobSpec is named by "
            "identity only among the specs of one schedule_bulk call"
        )
    return ValueError(
        f"depends_on of jobs[{index}] names a JobSpec that is not in this "
        "schedule_bulk call; pass it in the same call, or its job id"
    )


def _refuse_cycles(graph: Graph) -> None:
    """Kahn's algorithm over the edges between the call's own jobs: what is left
    after every job with no unplaced dependency is placed lies on a cycle."""
    index_of = graph.index_of
    waiting_on = [0] * len(graph.rows)
    dependents: dict[int, list[int]] = {}
    for index, deps in enumerate(graph.depends_on):
        for dep in deps:
            at = index_of.get(dep)
            if at is not None:
                waiting_on[index] += 1
                dependents.setdefault(at, []).append(index)
    ready = [i for i, n in enumerate(waiting_on) if n == 0]
    placed = 0
    while ready:
        at = ready.pop()
        placed += 1
        for after in dependents.get(at, ()):
            waiting_on[after] -= 1
            if waiting_on[after] == 0:
                ready.append(after)
    if placed < len(graph.rows):
        left = [graph.rows[i].job_id for i, n in enumerate(waiting_on) if n > 0]
        raise ValueError(
            f"depends_on forms a cycle among jobs {left[:10]}"
            f"{' ...' if len(left) > 10 else ''}; nothing was scheduled"
        )


@dataclass
class Writes:
    """What a :class:`Graph` writes, once the database has said which given ids
    exist (IGNORE skips them) and which jobs outside the call it depends on."""

    rows: list[NewJob]
    unmet: list[int | None]  # per row: dependencies not met (None: it has none)
    depended: list[bool]  # per row: some row of the call depends on it
    inner_edges: list[tuple[str, str, int, str]]  # to rows written here
    outer_edges: list[tuple[str, str, int, str, bool]]  # to existing jobs (completed?)
    ended: dict[str, str]  # existing dependencies ended without completing
    ids: list[str | None]  # the call's answer: one per row, None where skipped


def outside(graph: Graph, skipped: set[str]) -> tuple[list[int], set[str], set[str]]:
    """(the rows written, in order; the ids they depend on among them; those
    outside the call, existing jobs to lock) when ``skipped`` ids exist."""
    index_of = graph.index_of
    written = [
        i
        for i, row in enumerate(graph.rows)
        if row.job_id not in skipped and index_of[row.job_id] == i  # IGNORE: first wins
    ]
    inside: set[str] = set()
    beyond: set[str] = set()
    for i in written:
        for dep in graph.depends_on[i]:
            if dep in index_of and dep not in skipped:
                inside.add(dep)
            else:
                beyond.add(dep)
    return written, inside, beyond


def writes(graph: Graph, written: list[int], inside: set[str], status_of: dict[str, str]) -> Writes:
    """The rows and edges to write; ``status_of``: each existing dependency's
    status, read under its lock (ValueError naming those that do not exist)."""
    unknown = {dep for i in written for dep in graph.depends_on[i] if dep not in inside} - set(
        status_of
    )
    if unknown:
        raise ValueError(
            f"depends_on names jobs that do not exist: {sorted(unknown)[:10]}; "
            "nothing was scheduled"
        )
    out = Writes([], [], [], [], [], {}, [])
    for i in written:
        row = graph.rows[i]
        deps = graph.depends_on[i]
        policy = graph.policies[i]
        count = 0
        for ordinal, dep in enumerate(deps):
            if dep in inside:
                out.inner_edges.append((dep, row.job_id, ordinal, policy))
                count += 1
            else:
                completed = status_of[dep] == _COMPLETED
                out.outer_edges.append((dep, row.job_id, ordinal, policy, completed))
                count += not completed
        out.rows.append(row)
        out.unmet.append(count if deps else None)
        out.depended.append(row.job_id in inside)
    out.ended = {dep: s for dep, s in status_of.items() if s in _ENDED_OTHERWISE}
    done = {graph.rows[i].job_id for i in written}
    out.ids = [
        row.job_id if row.job_id in done and graph.index_of[row.job_id] == i else None
        for i, row in enumerate(graph.rows)
    ]
    return out


def _given_ids(graph: Graph) -> list[str]:
    return [row.job_id for row, mine in zip(graph.rows, graph.given, strict=True) if mine]


class GraphWriter:
    """Writes a :class:`Graph` through asyncpg, inside a transaction the caller opened."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dependencies = DependencyStore(None, store.schema)

    async def write(
        self,
        conn: asyncpg.Connection,
        graph: Graph,
        conflict: ConflictResolution,
        batch_size: int,
    ) -> list[str | None]:
        """Write ``graph``; one id per row, None where IGNORE skipped an existing id."""
        given_ids = _given_ids(graph)
        skipped: set[str] = set()
        if given_ids:
            existing = await self.store.existing_ids(conn, given_ids)
            if conflict is ConflictResolution.RAISE:
                check_none_existing(existing)
            skipped = set(existing)
        written, inside, beyond = outside(graph, skipped)
        status_of: dict[str, str] = {}
        if beyond:
            status_of = await self.dependencies.lock_dependencies(conn, sorted(beyond))
        out = writes(graph, written, inside, status_of)
        if not out.rows:
            return out.ids
        deps = self.dependencies
        if not given_ids and len(out.rows) >= COPY_THRESHOLD:
            await deps.copy_jobs(
                conn,
                [
                    (*row, _status(n), _wait_kind(n), n, d)
                    for row, n, d in zip(out.rows, out.unmet, out.depended, strict=True)
                ],
            )
        else:
            for start in range(0, len(out.rows), batch_size):
                end = start + batch_size
                await deps.insert_jobs(
                    conn, out.rows[start:end], out.unmet[start:end], out.depended[start:end]
                )
        if len(out.inner_edges) >= COPY_THRESHOLD:
            await deps.copy_edges(conn, out.inner_edges)
        elif out.inner_edges:
            await deps.insert_edges(conn, [(*edge, False) for edge in out.inner_edges])
        if out.outer_edges:
            await deps.insert_edges(conn, out.outer_edges)
        if out.ended:
            await deps.apply_ended(conn, out.ended)
        return out.ids


class DbapiGraphWriter:
    """The same writes through a caller's DB-API connection (psycopg 3 or
    psycopg2), inside the savepoint or transaction ``DbapiStatements.atomically``
    opened; INSERT statements only (no COPY)."""

    def __init__(self, statements: Any) -> None:
        self.statements = statements  # store.dbapi.DbapiStatements

    def write(
        self, conn: Any, graph: Graph, conflict: ConflictResolution, batch_size: int
    ) -> list[str | None]:
        statements = self.statements
        given_ids = _given_ids(graph)
        skipped: set[str] = set()
        if given_ids:
            existing = statements.existing_ids(conn, given_ids)
            if conflict is ConflictResolution.RAISE:
                check_none_existing(existing)
            skipped = set(existing)
        written, inside, beyond = outside(graph, skipped)
        status_of: dict[str, str] = {}
        if beyond:
            status_of = statements.lock_dependencies(conn, sorted(beyond))
        out = writes(graph, written, inside, status_of)
        for start in range(0, len(out.rows), batch_size):
            end = start + batch_size
            statements.insert_dependents(
                conn, out.rows[start:end], out.unmet[start:end], out.depended[start:end]
            )
        edges = [(*edge, False) for edge in out.inner_edges] + out.outer_edges
        if edges:
            statements.insert_edges(conn, edges)
        if out.ended:
            statements.apply_ended(conn, out.ended)
        return out.ids


def _status(unmet: int | None) -> str:
    return JobStatus.WAITING.value if unmet else JobStatus.PENDING.value


def _wait_kind(unmet: int | None) -> str | None:
    return WAIT_KIND if unmet else None
