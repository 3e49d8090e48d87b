"""Statements on ``scheduler_limits`` and the limited claim (see migration 0011).

A claim that may start jobs of a limited task or queue runs in one
transaction of two statements: the first locks the limit rows involved (in
key order, skipping rows another claim holds: then this claim takes nothing
from them), the second (a fresh snapshot under READ COMMITTED, so it sees
every start committed before the lock was granted) counts what runs, picks at
most what the limits leave, starts it and stamps the starts. Workers claiming
the same limited task or queue therefore take turns, and no race can start
more than the limits allow.

Priority orders limited and unlimited work together. While limits exist, the
plain claim (``_CLAIM_BESIDE_LIMITS``) also finds the most urgent due head of
a limited group whose limits have room (read without their locks: an
estimate), and takes only work more urgent than it, so neither the free
slots nor the claimed-ahead buffer go to less urgent unlimited work; the
limited claim then takes limited work up to the most urgent due unlimited
head (``_LIMITED_DUE`` finds both, and which limits bind each due group). A
limit with no room cuts nothing: its group waits, the rest runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from .job_sql import _CLAIMED_COLUMNS, claim_picked, claim_set, due_in_groups
from .names import Executor, Qualifier
from .queues import reachable_groups, served_groups

_SET_LIMITS = """
INSERT INTO scheduler_limits AS l (scope, name, max_running, rate_count, rate_period)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, name) DO UPDATE
   SET max_running = EXCLUDED.max_running, rate_count = EXCLUDED.rate_count,
       rate_period = EXCLUDED.rate_period, updated_at = now(),
       recent_starts = CASE WHEN EXCLUDED.rate_count IS NULL THEN '{}'
                            ELSE l.recent_starts END
"""
_CLEAR_LIMITS = "DELETE FROM scheduler_limits WHERE scope = $1 AND name = $2 RETURNING name"
_LIMITED_KEYS = "SELECT scope, name FROM scheduler_limits"

# Starts older than the window (plus a slack, see LimitStore.RATE_MARGIN) no longer count.
_IN_WINDOW = """ARRAY(SELECT s FROM unnest(l.recent_starts) AS s
                   WHERE s > clock_timestamp() - make_interval(
                       secs => l.rate_period + {margin} * LEAST(0.25, 0.1 * l.rate_period))
                   ORDER BY s)"""

_LIST_LIMITS = f"""
SELECT l.scope, l.name, l.max_running, l.rate_count, l.rate_period,
       cardinality({_IN_WINDOW.format(margin="0")}) AS started_in_window,
       (SELECT count(*) FROM scheduled_jobs r
         WHERE r.status = 'running'
           AND CASE l.scope WHEN 'task' THEN r.task_name ELSE r.queue END = l.name)::int
           AS running
  FROM scheduler_limits l
 ORDER BY l.scope, l.name
"""

# SKIP LOCKED: a limit row another worker's limited claim holds is skipped
# (that claim serves its jobs now), so claims never queue behind each other.
_LOCK = """
SELECT l.scope, l.name FROM scheduler_limits l
  JOIN unnest($1::text[], $2::text[]) AS k(scope, name) USING (scope, name)
 ORDER BY l.scope, l.name
   FOR UPDATE OF l SKIP LOCKED
"""

# $1/$2: the limit rows (locked by _LOCK in this transaction); $3: at most this
# many (the worker's free slots); $4: tasks; $5: queues (NULL: every queue);
# $6: worker; $7: lease seconds; $8: seconds of margin on the rate window
# (see LimitStore.RATE_MARGIN); $9: the most rows per queue (parallel to $5);
# $10/$11: the most urgent due unlimited work (priority, execution_time; NULL:
# none): only rows at least as urgent are taken.
# Only groups whose every binding limit is one of $1/$2 are read (so a limit
# this claim does not hold can never be exceeded), each from its head as the
# plain claim reads them.
_LIMITED_CLAIM = f"""
{
    served_groups(
        "$4",
        "$5",
        "$9",
        "$3",
        limits="$1::text[], $2::text[]",
        cut=("$10::int", "$11::timestamptz"),
    )
},
lim AS (
    SELECT l.scope, l.name, l.max_running, l.rate_count, l.rate_period,
           {_IN_WINDOW.format(margin="$8")} AS recent
      FROM scheduler_limits l
      JOIN unnest($1::text[], $2::text[]) AS k(scope, name) USING (scope, name)
), stamp AS (
    -- One stamp for every start of this claim, on every rate-limited row.
    SELECT clock_timestamp() AS at
), room AS (
    SELECT GREATEST(0, LEAST($3::int, min(LEAST(
               lim.max_running - (SELECT count(*) FROM scheduled_jobs r
                                   WHERE r.status = 'running'
                                     AND CASE lim.scope WHEN 'task' THEN r.task_name
                                                        ELSE r.queue END = lim.name),
               lim.rate_count - cardinality(lim.recent))))) AS n
      FROM lim
), {due_in_groups("(SELECT n FROM room)", cut="<=")}, claimed AS (
    UPDATE scheduled_jobs j
       SET {claim_set("$6", "$7", "false")}
      FROM kept AS picked
     WHERE j.ctid = picked.tid
    RETURNING {_CLAIMED_COLUMNS}
), stamped AS (
    UPDATE scheduler_limits l
       SET recent_starts = lim.recent || array_fill(
               (SELECT at FROM stamp),
               ARRAY[(SELECT count(*) FROM claimed WHERE claimed.status = 'running')::int])
      FROM lim
     WHERE l.scope = lim.scope AND l.name = lim.name AND lim.rate_count IS NOT NULL
)
-- limit_stamp: the claim's stamp, and limit_margin: the least margin of the
-- rates that bound it (NULL: no rate did), for the worker's check that each
-- function starts within that margin of its stamp (engine/rate_starts.py).
SELECT c.*, (SELECT at FROM stamp) AS limit_stamp,
       (SELECT min($8::float8 * LEAST(0.25, 0.1 * lim.rate_period)) FROM lim
         WHERE lim.rate_count IS NOT NULL) AS limit_margin
  FROM claimed c
"""

# A late start of a job a limited claim took (see engine/rate_starts.py),
# under the locks of the limit rows binding its task ($4) and queue ($5)
# (taken by the statement before, so this one's snapshot sees every start
# committed before they were granted): $1 job, $2 worker, $3 attempt, $6 the
# claim's stamp, $7 the rate window's margin (as a share). If the job is
# still this attempt's, one copy of the stamp goes from each rate-limited
# row and, where every such row's other starts in its window leave room, a
# stamp of now is added to each: ``moved`` true; no room: ``moved`` false
# (the worker hands the job back). No row: no longer this attempt's.
_RESTAMP = f"""
WITH mine AS (
    SELECT 1 FROM scheduled_jobs
     WHERE job_id = $1::text AND worker_id = $2::text AND attempts = $3::int
       AND status = 'running'
), lim AS (
    SELECT l.scope, l.name, l.rate_count, l.rate_period,
           array_position(l.recent_starts, $6::timestamptz) AS at, l.recent_starts
      FROM scheduler_limits l, mine
     WHERE ((l.scope = 'task' AND l.name = $4::text) OR (l.scope = 'queue' AND l.name = $5::text))
       AND l.rate_count IS NOT NULL
), kept AS (
    SELECT x.scope, x.name, x.rate_count, x.rate_period,
           CASE WHEN x.at IS NULL THEN x.recent_starts
                ELSE x.recent_starts[:x.at - 1] || x.recent_starts[x.at + 1:] END AS recent_starts
      FROM lim x
), room AS (
    SELECT coalesce(bool_and(
               cardinality({_IN_WINDOW.format(margin="$7::float8")}) < l.rate_count), true) AS ok
      FROM kept l
), moved AS (
    UPDATE scheduler_limits l
       SET recent_starts = k.recent_starts
                           || CASE WHEN room.ok THEN ARRAY[clock_timestamp()]
                                   ELSE '{{}}'::timestamptz[] END
      FROM kept k, room
     WHERE l.scope = k.scope AND l.name = k.name
)
SELECT room.ok AS moved FROM room, mine
"""
# The limit rows that bind a task ($1) and a queue ($2), locked in key order
# (as the limited claim's _LOCK orders them), waiting for a claim holding one.
_LOCK_FOR_RESTAMP = """
SELECT 1 FROM scheduler_limits l
 WHERE (l.scope = 'task' AND l.name = $1::text) OR (l.scope = 'queue' AND l.name = $2::text)
 ORDER BY l.scope, l.name
   FOR UPDATE
"""

# A limit row ``l`` that binds the group ``r``, and whether it has no room now
# (read without its lock: the limited claim decides under it). ``{margin}``:
# the rate window's margin, as the limited claim counts it.
_BINDS_R = """((l.scope = 'task' AND l.name = r.task_name)
                          OR (l.scope = 'queue' AND l.name = r.queue))"""
_FULL = f"""(CASE WHEN l.rate_count IS NOT NULL
                       AND l.rate_count <= cardinality({_IN_WINDOW.format(margin="{margin}")})
                  THEN true
                  WHEN l.max_running IS NULL THEN false
                  ELSE l.max_running <= (SELECT count(*) FROM scheduled_jobs x
                                          WHERE x.status = 'running'
                                            AND CASE l.scope WHEN 'task' THEN x.task_name
                                                             ELSE x.queue END = l.name) END)"""

# The plain claim while limits exist: _CLAIM's statement and parameters ($1 to
# $7), plus $8, the rate window's margin. ``limited_head``: the most urgent
# due head of a group this worker may run that a limit binds and every
# binding limit has room for; only unlimited work more urgent than it is
# taken, so it gets the next free slot (the limited claim runs when this one
# comes back short) and no less urgent row is claimed ahead of it.
_CLAIM_BESIDE_LIMITS = f"""
{reachable_groups("$1", "$6", "$7", "$2")},
full_limits AS MATERIALIZED (
    -- Each limit binding a due group, its room checked once (the cheap rate
    -- window first; running jobs counted only for a limit that binds due work).
    SELECT l.scope, l.name FROM scheduler_limits l
     WHERE CASE WHEN EXISTS (SELECT 1 FROM reachable r
                              WHERE r.limited AND r.head <= now() AND {_BINDS_R})
                THEN {_FULL.format(margin="$8")} ELSE false END
), limited_head AS (
    SELECT r.priority, r.head FROM reachable r
     WHERE r.limited AND r.head <= now()
       AND NOT EXISTS (SELECT 1 FROM full_limits l WHERE {_BINDS_R})
     ORDER BY r.priority, r.head
     LIMIT 1
), served AS (
    SELECT r.queue, r.task_name, r.priority, r.head, r.cap,
           CASE WHEN h.priority IS NULL OR r.priority < h.priority
                THEN 'infinity'::timestamptz ELSE h.head END AS cut
      FROM reachable r LEFT JOIN limited_head h ON true
     WHERE NOT r.limited AND (h.priority IS NULL OR r.priority <= h.priority)
), {due_in_groups("$2", cut="<")}, {claim_picked()}"""

# What the limited claim may take now ($1 tasks, $2 queues (NULL: all), $3
# caps, $4 the rate window's margin): each due group a limit binds, with its
# head, its binding limit rows (scopes, names in key order, as _LOCK takes
# them) and whether one of them has no room (``full``); and one row with NULL
# scopes: the most urgent due unlimited head, if any. Unlocked reads: the
# claim decides.
_LIMITED_DUE = f"""
{reachable_groups("$1", "$2", "$3", "0")}
SELECT r.priority, r.head, k.scopes, k.names, k.full
  FROM reachable r
 CROSS JOIN LATERAL (
    SELECT array_agg(l.scope ORDER BY l.scope, l.name) AS scopes,
           array_agg(l.name ORDER BY l.scope, l.name) AS names,
           bool_or({_FULL.format(margin="$4")}) AS full
      FROM scheduler_limits l
     WHERE {_BINDS_R}
 ) k
 WHERE r.limited AND r.head <= now()
UNION ALL
(SELECT r.priority, r.head, NULL, NULL, NULL FROM reachable r
  WHERE NOT r.limited AND r.head <= now()
  ORDER BY r.priority, r.head
  LIMIT 1)
"""


class LimitStore:
    """Reads and writes ``scheduler_limits``; runs the limited claim."""

    #: Slack on the rate window for the gap between a claim's stamp and the
    #: job's own start, as a share of min(10 % of the period, 0.25 s): starts
    #: are counted over ``period`` plus the slack, and a job whose function
    #: would start later than the slack after its claim was sent is stamped
    #: again first (engine/rate_starts.py), so no span of ``period`` holds
    #: more than ``count`` function starts. 0.2: 20 ms for a rate per second.
    RATE_MARGIN = 0.2

    def __init__(self, pool: asyncpg.Pool, qualify: Qualifier) -> None:
        self.pool = pool
        self._set = qualify(_SET_LIMITS)
        self._clear = qualify(_CLEAR_LIMITS)
        self._keys = qualify(_LIMITED_KEYS)
        self._list = qualify(_LIST_LIMITS)
        self._lock = qualify(_LOCK)
        self._claim = qualify(_LIMITED_CLAIM)
        self._claim_beside = qualify(_CLAIM_BESIDE_LIMITS)
        self._due = qualify(_LIMITED_DUE)
        self._restamp = qualify(_RESTAMP)
        self._lock_for_restamp = qualify(_LOCK_FOR_RESTAMP)

    @classmethod
    def margin(cls, period: float) -> float:
        """The rate window's margin in seconds for a limit over ``period`` seconds."""
        return cls.RATE_MARGIN * min(0.25, 0.1 * period)

    async def restamp(
        self,
        conn: asyncpg.Connection,
        *,
        job_id: str,
        worker_id: str,
        attempt: int,
        task: str,
        queue: str,
        stamp: datetime,
    ) -> bool | None:
        """Move the start of ``job_id`` (this worker's ``attempt``), stamped
        ``stamp`` by its limited claim, to now on each rate limit binding
        ``task`` and ``queue``, if every one has room: True; no room: False,
        and its stamp is dropped (the caller hands the job back); None: the
        job is no longer this attempt's (nothing written)."""
        async with conn.transaction():
            await conn.execute(self._lock_for_restamp, task, queue)
            return await conn.fetchval(
                self._restamp, job_id, worker_id, attempt, task, queue, stamp, self.RATE_MARGIN
            )

    async def set(
        self,
        scope: str,
        name: str,
        max_running: int | None,
        rate_count: int | None,
        rate_period: float | None,
        db: Executor | None = None,
    ) -> None:
        await (db or self.pool).execute(
            self._set, scope, name, max_running, rate_count, rate_period
        )

    async def clear(self, scope: str, name: str) -> bool:
        return await self.pool.fetchval(self._clear, scope, name) is not None

    async def keys(self, db: Executor | None = None) -> list[tuple[str, str]]:
        return [(r["scope"], r["name"]) for r in await (db or self.pool).fetch(self._keys)]

    async def listing(self, db: Executor | None = None) -> list[asyncpg.Record]:
        return await (db or self.pool).fetch(self._list)

    async def claim(
        self,
        conn: asyncpg.Connection,
        keys: Sequence[tuple[str, str]],
        *,
        limit: int,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        caps: Sequence[int] | None,
        worker_id: str,
        lease_seconds: float,
        cut: tuple[int, datetime] | None = None,
    ) -> list[asyncpg.Record]:
        """Start up to ``limit`` due jobs of ``tasks`` in ``queues`` (None:
        every queue; ``caps``: the most per queue) within the limit rows
        ``keys`` ((scope, name) pairs); ``cut`` ((priority, execution_time)):
        only jobs at least as urgent."""
        scopes = [k[0] for k in keys]
        names = [k[1] for k in keys]
        async with conn.transaction():
            if len(await conn.fetch(self._lock, scopes, names)) < len(keys):
                return []  # held by another claim (or just removed): not this time
            return await conn.fetch(
                self._claim,
                scopes,
                names,
                limit,
                list(tasks),
                None if queues is None else list(queues),
                worker_id,
                lease_seconds,
                self.RATE_MARGIN,
                None if caps is None else list(caps),
                None if cut is None else cut[0],
                None if cut is None else cut[1],
            )

    async def claim_beside_limits(
        self,
        worker_id: str,
        task_names: list[str],
        limit: int,
        lease_seconds: float,
        db: Executor | None = None,
        *,
        start_now: int,
        queues: Sequence[str] | None,
        caps: Sequence[int | None] | None,
    ) -> list[asyncpg.Record]:
        """The plain claim (as :meth:`Store.claim`) of work more urgent than
        any due limited work whose limits have room (see the module docstring)."""
        return await (db or self.pool).fetch(
            self._claim_beside,
            task_names,
            limit,
            worker_id,
            lease_seconds,
            start_now,
            None if queues is None else list(queues),
            None if caps is None else list(caps),
            self.RATE_MARGIN,
        )

    async def due(
        self,
        db: Executor,
        task_names: Sequence[str],
        queues: Sequence[str] | None,
        caps: Sequence[int] | None,
    ) -> list[asyncpg.Record]:
        """The due limited groups (priority, head, scopes, names, full), and
        the most urgent due unlimited head (scopes NULL): see _LIMITED_DUE."""
        return await db.fetch(
            self._due,
            list(task_names),
            None if queues is None else list(queues),
            None if caps is None else list(caps),
            self.RATE_MARGIN,
        )
