"""The statements about queues: the skip scan the claim, the next-due probe and
the statistics share, and pause/resume/list of ``scheduler_queues`` (0007).

``scheduled_jobs_claim_idx`` is ``(queue, task_name, priority, execution_time)
WHERE status = 'pending'``. :func:`served_groups` finds the distinct (queue,
task, priority) groups of pending rows with one index descent per group (a
recursive skip scan), keeps those a worker serves, and the caller then reads
each kept group from its head, in execution_time order. So pending rows of
queues a worker does not serve, or of tasks it has not registered, cost its
claims one descent per group, whatever their number.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import asyncpg

from ..enums import DEFAULT_QUEUE
from .names import DEFAULT_SCHEMA, Executor, Qualifier

# Every (queue, task_name, priority) that has a pending row without a fair
# share key (keyed rows: store/fair_sql.py, migration 0018), with its earliest
# execution_time (the group's head): one index descent each. Readers start
# each group at its head, so the dead index entries a busy group leaves at its
# front (claimed rows not yet vacuumed) are walked once per statement, here.
GROUPS = """
groups AS (
    (SELECT j.queue, j.task_name, j.priority, j.execution_time FROM scheduled_jobs j
      WHERE j.status = 'pending' AND j.concurrency_key IS NULL AND j.fair_share_key IS NULL
      ORDER BY j.queue, j.task_name, j.priority, j.execution_time LIMIT 1)
    UNION ALL
    SELECT n.queue, n.task_name, n.priority, n.execution_time
      FROM groups g
     CROSS JOIN LATERAL (
        SELECT j.queue, j.task_name, j.priority, j.execution_time FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.concurrency_key IS NULL AND j.fair_share_key IS NULL
           AND (j.queue, j.task_name, j.priority) > (g.queue, g.task_name, g.priority)
         ORDER BY j.queue, j.task_name, j.priority, j.execution_time LIMIT 1
     ) n
)"""


# The same groups, but only those named by four parallel arrays (queue, task,
# priority, floor): each group's head is searched from its floor instead of
# from the group's start. A pending row dated before its group's floor, or of
# a group not named, is not seen. While the horizon is pinned the dead index
# entries at a group's front cannot be removed, and the search from the start
# walks all of them every time; from the floor it walks those of the margin
# only (engine/heads.py keeps the floors).
SEEDED_GROUPS = """
groups AS (
    SELECT h.queue, h.task_name, h.priority, n.execution_time
      FROM unnest({seeds}) AS h(queue, task_name, priority, floor)
     CROSS JOIN LATERAL (
        SELECT j.execution_time FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.concurrency_key IS NULL AND j.fair_share_key IS NULL
           AND j.queue = h.queue AND j.task_name = h.task_name AND j.priority = h.priority
           AND j.execution_time >= h.floor
         ORDER BY j.execution_time
         LIMIT 1
     ) n
)"""


class Floors(NamedTuple):
    """Groups of pending rows, each with the floor its head is searched from
    (four parallel lists: the parameters of :data:`SEEDED_GROUPS`)."""

    queues: list[str]
    tasks: list[str]
    priorities: list[int]
    floors: list[datetime]


def seeds_from(n: int) -> str:
    """The four seed parameters of :data:`SEEDED_GROUPS`, numbered from ``$n``."""
    return f"${n}::text[], ${n + 1}::text[], ${n + 2}::int[], ${n + 3}::timestamptz[]"


# Every (queue, task_name, fair_share_key, priority) that has a pending row
# with a fair share key (migration 0018), with its head and the head's weight:
# one descent of scheduled_jobs_fair_idx each (store/fair_sql.py).
FAIR_GROUPS = """
fair_groups AS (
    (SELECT j.queue, j.task_name, j.fair_share_key, j.priority, j.execution_time,
            j.fair_share_weight
       FROM scheduled_jobs j
      WHERE j.status = 'pending' AND j.fair_share_key IS NOT NULL
      ORDER BY j.queue, j.task_name, j.fair_share_key, j.priority, j.execution_time LIMIT 1)
    UNION ALL
    SELECT n.queue, n.task_name, n.fair_share_key, n.priority, n.execution_time,
           n.fair_share_weight
      FROM fair_groups g
     CROSS JOIN LATERAL (
        SELECT j.queue, j.task_name, j.fair_share_key, j.priority, j.execution_time,
               j.fair_share_weight
          FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.fair_share_key IS NOT NULL
           AND (j.queue, j.task_name, j.fair_share_key, j.priority)
               > (g.queue, g.task_name, g.fair_share_key, g.priority)
         ORDER BY j.queue, j.task_name, j.fair_share_key, j.priority, j.execution_time
         LIMIT 1
     ) n
)"""


# The heads of both kinds of groups (after WITH RECURSIVE GROUPS, FAIR_GROUPS).
HEADS = """(SELECT queue, task_name, execution_time FROM groups
          UNION ALL
          SELECT queue, task_name, execution_time FROM fair_groups)"""


_BINDS = """((b.scope = 'task' AND b.name = g.task_name)
                               OR (b.scope = 'queue' AND b.name = g.queue))"""


def served_groups(
    tasks: str,
    queues: str,
    caps: str,
    default_cap: str,
    limits: str | None = None,
    cut: tuple[str, str] | None = None,
    seeds: str | None = None,
) -> str:
    """``WITH RECURSIVE groups AS (...), served AS (...)``: the groups of tasks
    ``tasks`` (a text[] parameter) in queues ``queues`` (text[]; NULL: every
    queue) that are not paused, each with ``cap``: the most rows one claim may
    take from its queue (``caps``: an int[] parallel to ``queues``, NULL entries
    or a NULL array meaning ``default_cap``).

    ``limits`` (migration 0011): ``"none"`` keeps only groups that no global
    limit binds (the plain claim); a pair of text[] parameters ``"$a, $b"``
    (scopes, names) keeps only groups whose every binding limit is one of those
    rows (the limited claim, which holds their locks); None keeps all.

    ``cut``: a (priority, execution_time) pair of SQL expressions (NULL: no
    cut); groups of a less urgent priority are left out, and ``served.cut``
    is the latest execution_time a reader takes from the group ('infinity'
    for groups more urgent than the cut; see :func:`job_sql.due_in_groups`).

    ``seeds``: the groups are those the arrays name, each searched from its
    floor (:data:`SEEDED_GROUPS`), instead of every group from its start."""
    limit_filter = bound = ""
    if limits is not None:
        # The limit rows, read once per statement (a tiny table: one page),
        # then matched in memory for every group.
        bound = """
bound AS MATERIALIZED (SELECT l.scope, l.name FROM scheduler_limits l),"""
        held = (
            ""
            if limits == "none"
            else f" AND (b.scope, b.name) NOT IN (SELECT * FROM unnest({limits}))"
        )
        limit_filter = f"""
       AND NOT EXISTS (SELECT 1 FROM bound b
                        WHERE {_BINDS}{held})"""
    cut_column = cut_filter = ""
    if cut is not None:
        priority, time = cut
        cut_column = f""",
           CASE WHEN {priority} IS NULL OR g.priority < {priority} THEN 'infinity'::timestamptz
                ELSE {time} END AS cut"""
        cut_filter = f"""
       AND ({priority} IS NULL OR g.priority <= {priority})"""
    groups = GROUPS if seeds is None else SEEDED_GROUPS.format(seeds=seeds)
    return f"""WITH RECURSIVE {groups},{bound}
served AS (
    SELECT g.queue, g.task_name, g.priority, g.execution_time AS head,
           coalesce(c.cap, {default_cap}) AS cap{cut_column}
      FROM groups g
      LEFT JOIN unnest({queues}::text[], {caps}::int[]) AS c(queue, cap) ON c.queue = g.queue
     WHERE g.task_name = ANY({tasks}::text[])
       AND ({queues}::text[] IS NULL OR c.queue IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM scheduler_queues q
                        WHERE q.name = g.queue AND q.paused){limit_filter}{cut_filter}
)"""


def reachable_groups(tasks: str, queues: str, caps: str, default_cap: str) -> str:
    """``WITH RECURSIVE groups AS (...), bound AS (...), reachable AS (...)``:
    every group a worker running ``tasks`` in ``queues`` may claim from (the
    arguments as for :func:`served_groups`), limited or not, with ``limited``:
    whether a global limit binds it, and ``cap``. ``bound`` holds the limit
    rows (scope, name) for the caller to match with ``g``-free conditions."""
    return f"""WITH RECURSIVE {GROUPS},
bound AS MATERIALIZED (SELECT l.scope, l.name FROM scheduler_limits l),
reachable AS (
    SELECT g.queue, g.task_name, g.priority, g.execution_time AS head,
           coalesce(c.cap, {default_cap}) AS cap,
           EXISTS (SELECT 1 FROM bound b WHERE {_BINDS}) AS limited
      FROM groups g
      LEFT JOIN unnest({queues}::text[], {caps}::int[]) AS c(queue, cap) ON c.queue = g.queue
     WHERE g.task_name = ANY({tasks}::text[])
       AND ({queues}::text[] IS NULL OR c.queue IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM scheduler_queues q
                        WHERE q.name = g.queue AND q.paused)
)"""


# Every group of tasks $1 in queues $2 (NULL: all) with its head, paused
# queues too (a resumed queue's groups are known at once): the floors of the
# seeded claim (engine/heads.py).
GROUP_HEADS = f"""
WITH RECURSIVE {GROUPS}
SELECT g.queue, g.task_name, g.priority, g.execution_time FROM groups g
 WHERE g.task_name = ANY($1::text[]) AND ($2::text[] IS NULL OR g.queue = ANY($2::text[]))
"""


# The wait of the oldest due job per queue, for operators (statistics): from
# the groups' heads, never from a scan of the backlog.
_OLDEST_DUE_BY_QUEUE = f"""
WITH RECURSIVE {GROUPS}, {FAIR_GROUPS}
SELECT g.queue, EXTRACT(EPOCH FROM now() - min(g.execution_time))::float8 AS oldest_due
  FROM {HEADS} g
 WHERE g.execution_time <= now()
 GROUP BY g.queue
"""

_SET_PAUSED = """
INSERT INTO scheduler_queues AS q (name, paused) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
 WHERE q.paused IS DISTINCT FROM EXCLUDED.paused
"""
# Every worker hears pause and resume ($1: "pause NAME" or "resume NAME"): a
# pause hands back its claimed-ahead rows; a resumed queue's workers look at
# once ($2: the queue, sent as job inserts send it: '' for "default").
_ANNOUNCE = f"""
SELECT pg_notify('pg_scheduler_queues', $1),
       CASE WHEN $2::text IS NOT NULL
            THEN pg_notify('pg_scheduler_jobs',
                           CASE WHEN $2::text = '{DEFAULT_QUEUE}' THEN '' ELSE $2::text END) END
"""

# A stored queue row dropped (only when nothing waits in the queue, unless
# forced); a paused one is announced as resumed.
_DELETE_QUEUE = """
DELETE FROM scheduler_queues q
 WHERE q.name = $1
   AND ($2 OR NOT EXISTS (SELECT 1 FROM scheduled_jobs j
                           WHERE j.queue = q.name AND j.status IN ('pending', 'running')))
RETURNING q.paused
"""

# Queues known from either side: configured rows and queues that have jobs
# (pending or running, counted here; finished rows are not read).
_QUEUES = """
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending')::bigint AS pending,
           count(*) FILTER (WHERE status = 'pending' AND execution_time <= now())::bigint AS due,
           count(*) FILTER (WHERE status = 'running')::bigint AS running
      FROM scheduled_jobs WHERE status IN ('pending', 'running')
     GROUP BY queue
)
SELECT coalesce(q.name, c.queue) AS name, coalesce(q.paused, false) AS paused,
       coalesce(c.pending, 0) AS pending, coalesce(c.due, 0) AS due,
       coalesce(c.running, 0) AS running
  FROM scheduler_queues q FULL JOIN counts c ON c.queue = q.name
 ORDER BY 1
"""


class QueueStore:
    """Pause, resume and list queues, through one pool, qualified for one schema."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._set_paused = q(_SET_PAUSED)
        self._announce = q(_ANNOUNCE)
        self._queues = q(_QUEUES)
        self._oldest_due_by_queue = q(_OLDEST_DUE_BY_QUEUE)
        self._delete = q(_DELETE_QUEUE)

    async def set_paused(self, name: str, paused: bool) -> None:
        """Pause or resume ``name``; a resume wakes the workers that serve it."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(self._set_paused, name, paused)
            action = "pause" if paused else "resume"
            await conn.execute(self._announce, f"{action} {name}", None if paused else name)

    async def delete(self, name: str, force: bool) -> bool | None:
        """Drop ``name``'s stored row: whether it was paused (a paused queue's
        workers are told it resumed), or None when there is no such row, or
        (not ``force``) jobs still wait in it."""
        async with self.pool.acquire() as conn, conn.transaction():
            paused = await conn.fetchval(self._delete, name, force)
            if paused:
                await conn.execute(self._announce, f"resume {name}", name)
        return paused

    async def queues(self, db: Executor | None = None) -> list[asyncpg.Record]:
        """Every known queue: name, paused, pending, due, running."""
        return await (db or self.pool).fetch(self._queues)

    async def oldest_due_by_queue(self, db: Executor | None = None) -> dict[str, float]:
        rows = await (db or self.pool).fetch(self._oldest_due_by_queue)
        return {r["queue"]: r["oldest_due"] for r in rows}
