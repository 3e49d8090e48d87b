"""What the dashboard shows and does, as plain JSON-ready data; no HTTP here.

Reads go through ``store.dashboard`` (and the statistics store); actions go
through what the CLI uses: ``OpsStore.retry``, ``Store.cancel``, and a
never-started Scheduler's periodic methods (or the application's own
Scheduler when the dashboard was given one, so that triggering a periodic job
finds its function).
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from ..config import RetryPolicy
from ..enums import DEFAULT_QUEUE, JobPriority, JobStatus
from ..limits import key_record, limit_record
from ..models import Job
from ..observe.stats import fair_share_stats
from ..store import Store
from ..store.dashboard import Cursor, DashboardStore
from ..store.housekeeping import RETRYABLE_STATUSES, OpsStore, StatsStore
from ..store.orphans import Orphans, OrphanStore
from ..store.workflow_views import is_workflow_row
from ..store.workflows import WorkflowStore
from ..support.codec import decode_json
from ..support.validation import check_queue
from .data import MAX_PAGE, Conflict, NotFound, plain
from .workflows import WorkflowPages, workflow_operations

if TYPE_CHECKING:
    from ..scheduler import Scheduler

#: Seconds a worker may be silent and still count as alive (the Scheduler's default).
HEARTBEAT_THRESHOLD = 120.0
SERIES_SECONDS = 3600.0
SERIES_BUCKET = 60.0
#: Seconds an overview is reused: many open pages cost one table pass per second.
OVERVIEW_TTL = 1.0
#: A workflow's steps and children shown per page of its job page; unread
#: signals shown (their total is given).
STEPS_PAGE = 200
CHILDREN_PAGE = 200
SIGNALS_SHOWN = 50

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str | None) -> datetime | None:
    """``30m``/``2h``/``1d`` ago, or an ISO 8601 time (naive = UTC); ValueError else."""
    if not value:
        return None
    match = _DURATION.match(value.strip())
    if match:
        seconds = float(match[1]) * _UNIT_SECONDS[match[2]]
        return datetime.now(UTC) - timedelta(seconds=seconds)
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is neither a duration like 30m, 2h, 1d nor ISO 8601") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_batch_id(value: str | None) -> str | None:
    """A batch id (a UUID) to filter on, None for none; ValueError else."""
    if not value:
        return None
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise ValueError(f"batch must be a batch id (a UUID), got {value!r}") from None


def encode_cursor(cursor: Cursor) -> str:
    raw = f"{cursor.created_at.isoformat()}|{cursor.job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str | None) -> Cursor | None:
    if not text:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        when, _, job_id = raw.partition("|")
        return Cursor(datetime.fromisoformat(when), job_id)
    except ValueError:
        raise ValueError(f"not a page cursor: {text!r}") from None


def _seq(name: str, value: str | None) -> int:
    """A page position: the step seq after which to start (0: from the first)."""
    if not value:
        return 0
    try:
        seq = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if seq < 0:
        raise ValueError(f"{name} must be 0 or more, got {seq}")
    return seq


def _wait(row: asyncpg.Record) -> dict[str, Any] | None:
    """What a parked workflow waits for: kind sleep (until), signal (name, until
    its timeout or the workflow's deadline, if any), children (how many)."""
    if row["wait_kind"] is None:
        return None
    return {
        "kind": row["wait_kind"],
        "signal": row["wait_for"],
        "until": plain(row["wake_at"]),
        "seq": row["wait_seq"],
        "children": row["children_waiting"],
    }


class DashboardService:
    """One dashboard's reads and actions on one pool and schema."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        store: DashboardStore,
        schema: str,
        scheduler: Scheduler | None = None,
        pgbouncer: bool = False,
    ) -> None:
        self.pool = pool
        self.store = store
        self.schema = schema
        self.stats = StatsStore(pool, schema)
        self.ops = OpsStore(pool, schema)
        self.jobs_store = Store(pool, schema)
        self.orphan_store = OrphanStore(pool, schema)
        self._scheduler = scheduler
        self._pgbouncer = pgbouncer
        self._overview: tuple[float, dict[str, Any]] | None = None
        self._overview_lock = asyncio.Lock()
        #: The workflow list, graphs, whole-workflow actions and signals.
        self.workflows = WorkflowPages(
            workflow_operations(pool, schema, scheduler), WorkflowStore(pool, schema)
        )

    @property
    def scheduler(self) -> Scheduler:
        """The application's Scheduler, else one never started (for its periodic methods)."""
        if self._scheduler is None:
            from ..scheduler import Scheduler

            self._scheduler = Scheduler(
                self.pool,
                vacuum_enabled=False,
                run_periodic_jobs=False,
                schema=self.schema,
                pgbouncer=self._pgbouncer,
            )
        return self._scheduler

    # -- reads -----------------------------------------------------------------

    async def overview(self) -> dict[str, Any]:
        async with self._overview_lock:
            cached = self._overview
            if cached is not None and time.monotonic() - cached[0] < OVERVIEW_TTL:
                return cached[1]
            data = await self._read_overview()
            self._overview = (time.monotonic(), data)
            return data

    async def _read_overview(self) -> dict[str, Any]:
        rows = await self.store.counts()
        series_rows = await self.store.finished_series(SERIES_SECONDS, SERIES_BUCKET)
        async with self.pool.acquire() as conn:
            orphans = await self.orphan_store.read(HEARTBEAT_THRESHOLD, db=conn)
            orphaned_tasks = sorted({o.task_name for o in orphans.jobs})
            # The headline wait is of work some live worker runs; orphans have their own.
            oldest = await self.store.served_oldest_due_seconds(conn, orphaned_tasks)
            now = await StatsStore.now(conn)
            workers = await self.stats.workers(conn)
        counts = dict.fromkeys((s.value for s in JobStatus), 0)
        due = 0
        tasks: dict[str, dict[str, int]] = {}
        for r in rows:
            counts[r["status"]] += r["n"]
            due += r["due"]
            task = tasks.setdefault(r["task_name"], dict.fromkeys(counts, 0))
            task[r["status"]] += r["n"]
        queues = await self._queue_rows(rows)
        points: dict[float, dict[str, Any]] = {}
        for r in series_rows:
            point = points.setdefault(r["bucket"], {"t": r["bucket"]})
            point[r["status"]] = r["n"]
        series = [points[t] for t in sorted(points)]
        cutoff = now.timestamp()
        rates: dict[str, Any] = {}
        for window in (300, 3600):
            done = sum(p.get("completed", 0) for p in series if p["t"] >= cutoff - window)
            bad = sum(p.get("failed", 0) for p in series if p["t"] >= cutoff - window)
            rates[str(window)] = {
                "completed": done,
                "failed": bad,
                "throughput": done / window,
                "failure_rate": bad / (done + bad) if done + bad else None,
            }
        return {
            "taken_at": plain(now),
            "counts": counts,
            "total": sum(counts.values()),
            "due": due,
            "scheduled": counts["pending"] - due,
            "oldest_due_seconds": None if oldest is None else max(0.0, oldest),
            "orphans": self._orphans(orphans, now),
            "queues": queues,
            "tasks": [{"task": name, "counts": c} for name, c in sorted(tasks.items())],
            "series": {"bucket_seconds": SERIES_BUCKET, "points": series},
            "windows": rates,
            "live_workers": sum(1 for w in workers if w["seen_seconds_ago"] <= HEARTBEAT_THRESHOLD),
            "named_queues": self.store.catalog.has_queue_column,
        }

    @staticmethod
    def _orphans(orphans: Orphans, now: datetime) -> dict[str, Any]:
        """Due jobs no live worker runs (per task and queue) and periodic jobs no
        live process declares, with the oldest orphaned job's wait."""
        jobs = [
            {
                **plain(o._asdict()),
                "waited_seconds": max(0.0, (now - o.oldest_due).total_seconds()),
            }
            for o in orphans.jobs
        ]
        return {
            "jobs": jobs,
            "due": sum(o.due for o in orphans.jobs),
            "oldest_due_seconds": max((j["waited_seconds"] for j in jobs), default=None),
            "periodic": [plain(o._asdict()) for o in orphans.periodic],
        }

    async def _queue_rows(self, rows: list[asyncpg.Record]) -> list[dict[str, Any]]:
        settings = {r["name"]: r for r in await self.store.queue_settings()}
        # Global limits of queues (scheduler_limits), shown with their settings.
        limits = {
            r["name"]: {"max_running": r["max_running"], "rate_limit": r["rate_limit"]}
            for r in map(limit_record, await self.store.limits.listing())
            if r["scope"] == "queue"
        }
        queues: dict[str, dict[str, Any]] = {}
        for name in [DEFAULT_QUEUE, *settings, *limits]:
            queues.setdefault(name, {"queue": name, "counts": {}, "due": 0})
        for r in rows:
            q = queues.setdefault(r["queue"], {"queue": r["queue"], "counts": {}, "due": 0})
            q["counts"][r["status"]] = q["counts"].get(r["status"], 0) + r["n"]
            q["due"] += r["due"]
        for name, q in queues.items():
            row = settings.get(name)
            q["paused"] = bool(row["paused"]) if row is not None else False
            extra = decode_json(row["settings"]) if row is not None else {}
            hidden = ("name", "paused", "created_at", "updated_at")
            q["settings"] = {k: v for k, v in (extra or {}).items() if k not in hidden}
            q["settings"].update({k: v for k, v in limits.get(name, {}).items() if v is not None})
        return [queues[name] for name in sorted(queues)]

    async def queues(self) -> dict[str, Any]:
        rows = await self.store.counts()
        keys = self.store.keys
        busiest = [] if keys is None else await keys.busiest(self.store.pool, 20)
        fair = self.store.fair
        tenants = [] if fair is None else await fair.busiest(20)
        return {
            "queues": await self._queue_rows(rows),
            "named_queues": self.store.catalog.has_queue_table,
            # The busiest concurrency keys (docs/keys.md).
            "keys": [key_record(r) for r in busiest],
            # The busiest fair share keys, each with its share of the recent starts.
            "fair_share": [s.model_dump() for s in fair_share_stats(tenants)],
        }

    async def jobs(self, params: dict[str, str]) -> dict[str, Any]:
        """One page of jobs. ``params``: status (comma-separated), task, queue,
        since, until, q (search), batch (a batch id), after (cursor), limit.
        ValueError on bad input."""
        statuses = [s for s in (params.get("status") or "").split(",") if s]
        unknown = set(statuses) - {s.value for s in JobStatus}
        if unknown:
            raise ValueError(f"unknown status {sorted(unknown)}")
        try:
            limit = int(params.get("limit") or 50)
        except ValueError:
            raise ValueError(f"limit must be an integer, got {params.get('limit')!r}") from None
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be 1..{MAX_PAGE}, got {limit}")
        rows = await self.store.list_jobs(
            statuses=statuses or None,
            task=params.get("task") or None,
            queue=params.get("queue") or None,
            since=parse_time(params.get("since")),
            until=parse_time(params.get("until")),
            search=params.get("q") or None,
            after=decode_cursor(params.get("after")),
            limit=limit + 1,
            batch_id=parse_batch_id(params.get("batch")),
        )
        page = rows[:limit]
        more = len(rows) > limit
        last = page[-1] if page and more else None
        return {
            "jobs": [self._list_row(r) for r in page],
            "next": encode_cursor(Cursor(last["created_at"], last["job_id"])) if last else None,
        }

    @staticmethod
    def _list_row(row: asyncpg.Record) -> dict[str, Any]:
        data = plain(row)
        data["priority"] = JobPriority.from_db_value(row["priority"]).value
        return data

    async def job(
        self, job_id: str, steps_after: str | None = None, children_after: str | None = None
    ) -> dict[str, Any]:
        """One job in full; for a workflow (or a workflow's child) also
        ``workflow``: its wait, parent, steps, children and unread signals,
        steps and children a page at a time (after the given step seq)."""
        row = await self.jobs_store.get_job(job_id)
        if row is None:
            raise NotFound(f"no job with id {job_id!r}")
        job = Job.from_record(row, RetryPolicy())
        data = plain(job.model_dump())
        data["queue"] = await self.store.job_queue(job_id)
        data["timeline"] = self._timeline(job)
        data["in_graph"] = await self.store.in_graph(job_id)
        data["workflow"] = await self._workflow(
            job_id, _seq("steps_after", steps_after), _seq("children_after", children_after)
        )
        return data

    async def _workflow(
        self, job_id: str, steps_after: int, children_after: int
    ) -> dict[str, Any] | None:
        views = self.store.workflows
        wait = (await views.waits([job_id])).get(job_id)
        if wait is None:  # no workflows in this schema (or the job just went)
            return None
        totals = await views.totals(job_id)
        if not is_workflow_row(wait, totals):
            return None  # a plain job
        steps = await views.steps(job_id, after=steps_after, limit=STEPS_PAGE + 1)
        children = await views.children(job_id, after=children_after, limit=CHILDREN_PAGE + 1)
        signals = await views.pending_signals(job_id, limit=SIGNALS_SHOWN)
        return {
            "wait": _wait(wait),
            "deadline": plain(wait["workflow_deadline"]),
            "parent": (
                None
                if wait["parent_job_id"] is None
                else {
                    "job_id": wait["parent_job_id"],
                    "seq": wait["parent_seq"],
                    "task_name": wait["parent_task"],
                    "status": wait["parent_status"],
                }
            ),
            "steps": [plain(r) for r in steps[:STEPS_PAGE]],
            "steps_total": totals["steps"],
            "steps_after": steps_after,
            "steps_next": steps[STEPS_PAGE - 1]["seq"] if len(steps) > STEPS_PAGE else None,
            "children": [plain(r) for r in children[:CHILDREN_PAGE]],
            "children_total": totals["children"],
            "children_counts": await views.child_counts(job_id) if totals["children"] else {},
            "children_after": children_after,
            "children_next": (
                children[CHILDREN_PAGE - 1]["seq"] if len(children) > CHILDREN_PAGE else None
            ),
            "signals": [plain(r) for r in signals],
            "signals_total": totals["pending_signals"],
        }

    @staticmethod
    def _timeline(job: Job) -> list[dict[str, Any]]:
        marks: list[tuple[datetime, str]] = []
        if job.created_at:
            marks.append((job.created_at, "created"))
        marks.append((job.execution_time, "due"))
        for a in job.attempt_history:
            if a.started_at:
                marks.append((a.started_at, f"attempt {a.attempt} started"))
            if a.finished_at and a.outcome:
                marks.append((a.finished_at, f"attempt {a.attempt} {a.outcome}"))
        if job.progress_at:
            marks.append((job.progress_at, "progress reported"))
        if job.finished_at and job.status.is_final:
            marks.append((job.finished_at, job.status.value))
        return [{"at": plain(at), "what": what} for at, what in sorted(marks, key=lambda m: m[0])]

    async def workers(self) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            rows = await self.stats.workers(conn)
        running = await self.store.running_jobs()
        by_worker: dict[str, list[dict[str, Any]]] = {}
        for r in running:
            by_worker.setdefault(r["worker_id"] or "", []).append(plain(r))
        workers = []
        for r in rows:
            data = plain(r)
            data["alive"] = r["seen_seconds_ago"] <= HEARTBEAT_THRESHOLD
            data["tasks"] = list(dict.fromkeys(r["tasks"] or ()))  # each once, in order
            data["running"] = by_worker.pop(r["worker_id"], [])
            workers.append(data)
        orphans = [job for jobs in by_worker.values() for job in jobs]
        return {"workers": workers, "unowned_running": orphans}

    async def periodic(self) -> dict[str, Any]:
        return {"periodic": [plain(r) for r in await self.ops.periodic_jobs()]}

    # -- actions ---------------------------------------------------------------

    async def retry(self, job_id: str) -> dict[str, Any]:
        if await self.ops.retry([job_id]):
            return {"retried": job_id}
        await self._explain(job_id, f"only {', '.join(RETRYABLE_STATUSES)} jobs can be retried")
        raise AssertionError("unreachable")

    async def cancel(self, job_id: str) -> dict[str, Any]:
        if await self.jobs_store.cancel(job_id):
            return {"cancelled": job_id}
        await self._explain(job_id, "only pending, running or waiting jobs can be cancelled")
        raise AssertionError("unreachable")

    async def _explain(self, job_id: str, rule: str) -> None:
        row = await self.jobs_store.get_job(job_id)
        if row is None:
            raise NotFound(f"no job with id {job_id!r}")
        raise Conflict(f"job {job_id!r} is {row['status']}; {rule}")

    async def set_queue_paused(self, name: str, paused: bool) -> dict[str, Any]:
        check_queue(name)  # ValueError/TypeError: a bad request, nothing written
        if not await self.store.set_queue_paused(name, paused):
            raise Conflict("this schema has no named queues (scheduler_queues) to pause")
        self._overview = None
        return {"queue": name, "paused": paused}

    async def _periodic_key(self, key: str) -> asyncpg.Record:
        rows = await self.ops.periodic_jobs(key)
        exact = [r for r in rows if r["dedup_key"] == key]
        if exact:
            return exact[0]
        if len(rows) == 1:
            return rows[0]
        raise NotFound(f"no periodic job with dedup key {key!r}")

    async def set_periodic_enabled(self, key: str, enabled: bool) -> dict[str, Any]:
        row = await self._periodic_key(key)
        if not await self.scheduler.set_periodic_job_enabled(row["dedup_key"], enabled):
            raise NotFound(f"no periodic job with dedup key {key!r}")
        return {"dedup_key": row["dedup_key"], "enabled": enabled}

    async def trigger_periodic(self, key: str) -> dict[str, Any]:
        row = await self._periodic_key(key)
        job_id = await self.scheduler.trigger_periodic_job(row["dedup_key"])
        if job_id is None:
            raise Conflict(
                f"periodic job {row['job_name']} is not registered in the dashboard's "
                "process: run the dashboard with --app MODULE (the module declaring it), "
                "or mount it in the application"
            )
        return {"dedup_key": row["dedup_key"], "job_id": job_id}
