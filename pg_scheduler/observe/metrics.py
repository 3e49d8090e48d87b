"""Prometheus exposition of :class:`pg_scheduler.observe.stats.QueueStats` (extra ``metrics``).

The figures are those of :meth:`Scheduler.stats`. A background task refreshes
a snapshot every ``interval`` seconds and scrapes read that snapshot, so a
scrape never waits on (or loads) the database, and any number of scrapers
cost one query round per interval. Needs the ``metrics`` extra
(``pip install -e '.[metrics]'`` in a clone of the repository).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import asyncpg

from ..enums import DEFAULT_QUEUE, FINAL_STATUS_VALUES, JobStatus
from ..support.install import install_hint
from ..support.log import get_logger
from .stats import QueueStats, collect_stats

log = get_logger(__name__)


class StatsSource(Protocol):
    """What the exporter reads of a :class:`~pg_scheduler.Scheduler`: its ``stats()``."""

    async def stats(self) -> QueueStats: ...


def _require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            f"the Prometheus exporter needs prometheus-client: {install_hint('metrics')}"
        ) from None
    return prometheus_client


class _QueueCollector:
    """Turns the latest snapshot into metric families at scrape time."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self.exporter = exporter

    def describe(self) -> list[Any]:
        return []  # families depend on the data; skip the registry's duplicate check

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        stats = self.exporter.snapshot
        ok = GaugeMetricFamily(
            "pg_scheduler_stats_up", "1 if the last refresh from the database succeeded"
        )
        ok.add_metric([], 1.0 if self.exporter.last_error is None else 0.0)
        yield ok
        refreshed = GaugeMetricFamily(
            "pg_scheduler_stats_refreshed_timestamp_seconds", "When the figures were read"
        )
        refreshed.add_metric([], self.exporter.refreshed_at or 0.0)
        yield refreshed
        if stats is None:
            return

        jobs = GaugeMetricFamily(
            "pg_scheduler_jobs", "Jobs in the table by status and task", labels=["status", "task"]
        )
        due = GaugeMetricFamily(
            "pg_scheduler_jobs_due", "Pending jobs already due, by task", labels=["task"]
        )
        for t in stats.by_task:
            for status in (s.value for s in JobStatus):
                jobs.add_metric([status, t.task_name], getattr(t, status))
            due.add_metric([t.task_name], t.due)
        yield jobs
        yield due

        queue = GaugeMetricFamily(
            "pg_scheduler_queue_jobs",
            "Jobs per queue: pending, due (pending and due), running and waiting (parked)",
            labels=["queue", "state"],
        )
        paused = GaugeMetricFamily(
            "pg_scheduler_queue_paused", "1 for a paused queue", labels=["queue"]
        )
        for q in stats.by_queue:
            for state in ("pending", "due", "running", "waiting"):
                queue.add_metric([q.queue, state], getattr(q, state))
            paused.add_metric([q.queue], 1.0 if q.paused else 0.0)
        yield queue
        yield paused

        oldest = GaugeMetricFamily(
            "pg_scheduler_oldest_pending_age_seconds",
            "How long the longest-waiting due job has been due (0 if none)",
        )
        oldest.add_metric([], stats.oldest_pending_age or 0.0)
        yield oldest

        running = GaugeMetricFamily(
            "pg_scheduler_running_jobs", "Running jobs by worker", labels=["worker_id"]
        )
        for worker_id, count in stats.running_by_worker.items():
            running.add_metric([worker_id], count)
        yield running

        alive = GaugeMetricFamily(
            "pg_scheduler_worker_alive",
            "1 for a worker whose heartbeat is recent, 0 for a registered but silent one",
            labels=["worker_id", "hostname"],
        )
        for w in stats.workers:
            alive.add_metric([w.worker_id, w.hostname], 1.0 if w.alive else 0.0)
        yield alive
        live = GaugeMetricFamily("pg_scheduler_live_workers", "Workers with a recent heartbeat")
        live.add_metric([], stats.live_workers)
        yield live

        finished = GaugeMetricFamily(
            "pg_scheduler_finished_jobs",
            "Jobs that finished within the window, by status",
            labels=["window_seconds", "status"],
        )
        throughput = GaugeMetricFamily(
            "pg_scheduler_throughput_per_second",
            "Completed jobs per second over the window",
            labels=["window_seconds"],
        )
        failure = GaugeMetricFamily(
            "pg_scheduler_failure_rate",
            "failed / (completed + failed) over the window",
            labels=["window_seconds"],
        )
        for win in stats.windows:
            label = f"{win.seconds:g}"
            for status in FINAL_STATUS_VALUES:
                if status == "completed" and stats.completed_deleted:
                    continue
                finished.add_metric([label, status], getattr(win, status))
            if win.throughput is not None:
                throughput.add_metric([label], win.throughput)
            if win.failure_rate is not None:
                failure.add_metric([label], win.failure_rate)
        yield finished
        yield throughput
        yield failure


# -- per-job histograms and counters (recorded where the engine finishes jobs) ----------

#: Buckets (seconds) of the duration and wait histograms: 1 ms to 10 min.
DEFAULT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)


class JobMetrics:
    """Histograms of job duration and wait (due -> start) and a counter of
    outcomes, per task and queue, fed by the engine (see :mod:`pg_scheduler.observe.instrument`).

    Use :func:`enable_job_metrics`; it records jobs this process runs. Wait is
    the worker's clock at start minus the job's due time (clocks of worker and
    database are assumed close); duration is the function's run time.
    """

    def __init__(self, registry: Any = None, buckets: tuple[float, ...] = DEFAULT_BUCKETS) -> None:
        prometheus = _require_prometheus()
        registry = prometheus.REGISTRY if registry is None else registry
        labels = ["task", "queue"]
        self.registry = registry
        self.duration = prometheus.Histogram(
            "pg_scheduler_job_duration_seconds",
            "Run time of job attempts in this process, by task and queue",
            labels,
            registry=registry,
            buckets=buckets,
        )
        self.wait = prometheus.Histogram(
            "pg_scheduler_job_wait_seconds",
            "From a job's due time to the start of its attempt, by task and queue",
            labels,
            registry=registry,
            buckets=buckets,
        )
        self.outcomes = prometheus.Counter(
            "pg_scheduler_job_outcomes",
            "Job attempts by how they ended: completed, retried, failed, cancelled, "
            "handed_back, lost, interrupted",
            [*labels, "outcome"],
            registry=registry,
        )
        # Label children by (task, queue): one dict lookup per job after the first.
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def job_started(self, row: Any, task: str) -> tuple[str, str]:
        queue = row.get("queue") or DEFAULT_QUEUE
        key = (task, queue)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.duration.labels(*key), self.wait.labels(*key))
        due = row.get("execution_time")
        if due is not None:
            children[1].observe(max(0.0, time.time() - due.timestamp()))
        return key

    def job_finished(self, handle: tuple[str, str], outcome: str, duration: float | None) -> None:
        if duration is not None:
            self._children[handle][0].observe(duration)
        self.outcomes.labels(handle[0], handle[1], outcome).inc()


_job_metrics: dict[int, JobMetrics] = {}


def enable_job_metrics(registry: Any = None) -> JobMetrics:
    """Record per-job histograms and outcome counters in ``registry`` (default:
    prometheus_client's global one) for every job this process runs. Calling
    it again for the same registry returns the same recorder."""
    import pg_scheduler.observe.instrument as instrument

    prometheus = _require_prometheus()
    key = id(prometheus.REGISTRY if registry is None else registry)
    metrics = _job_metrics.get(key)
    if metrics is None:
        metrics = _job_metrics[key] = JobMetrics(registry)
    instrument.add_observer(metrics)
    return metrics


def disable_job_metrics(metrics: JobMetrics) -> None:
    """Stop recording into ``metrics`` (its figures stay registered)."""
    import pg_scheduler.observe.instrument as instrument

    instrument.remove_observer(metrics)


class MetricsExporter:
    """Serve queue statistics at ``http://addr:port/metrics``.

    ``source`` is a :class:`Scheduler` (its ``stats()``) or an asyncpg pool.
    ``port=0`` picks a free port (read :attr:`port` after :meth:`start`).
    ``job_metrics``: also serve the per-job histograms and outcome counters of
    the jobs this process runs (:class:`JobMetrics`); default: when ``source``
    is a Scheduler.
    """

    def __init__(
        self,
        source: StatsSource | asyncpg.Pool,
        *,
        port: int,
        addr: str = "0.0.0.0",
        interval: float = 15.0,
        schema: str = "public",
        job_metrics: bool | None = None,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535, got {port!r}")
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        is_scheduler = False
        if isinstance(source, asyncpg.Pool):
            pool = source
            self._read: Callable[[], Awaitable[QueueStats]] = lambda: collect_stats(
                pool, schema=schema
            )
        elif hasattr(source, "stats"):
            self._read = source.stats
            is_scheduler = True
        else:
            raise TypeError("source must be a Scheduler or an asyncpg.Pool")
        self.port = port
        self.addr = addr
        self.interval = interval
        #: Per-job histograms and outcome counters of this process's jobs:
        #: on by default when ``source`` is a Scheduler.
        self.job_metrics = is_scheduler if job_metrics is None else job_metrics
        self._job_metrics: JobMetrics | None = None
        self.snapshot: QueueStats | None = None
        self.refreshed_at: float | None = None
        self.last_error: str | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> QueueStats | None:
        """Read the figures now; on failure keep the last ones and report not-up."""
        try:
            self.snapshot = await self._read()
        except Exception as exc:
            self.last_error = repr(exc)
            log.warning("metrics refresh failed", event_type="metrics", error=repr(exc))
            return None
        self.last_error = None
        self.refreshed_at = time.time()
        return self.snapshot

    async def start(self) -> None:
        """Read once, then serve and keep refreshing in the background."""
        prometheus = _require_prometheus()
        registry = prometheus.CollectorRegistry(auto_describe=False)
        registry.register(_QueueCollector(self))
        if self.job_metrics:
            # A Scheduler runs jobs here: serve their histograms too.
            self._job_metrics = enable_job_metrics(registry)
        await self.refresh()
        server, _thread = prometheus.start_http_server(self.port, self.addr, registry=registry)
        self._server = server
        self.port = server.server_port
        self._task = asyncio.create_task(self._loop(), name="pg_scheduler.metrics")
        log.info("metrics exporter serving", event_type="metrics", addr=self.addr, port=self.port)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.refresh()

    async def stop(self) -> None:
        if self._job_metrics is not None:
            disable_job_metrics(self._job_metrics)
            self._job_metrics = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()

    async def __aenter__(self) -> MetricsExporter:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()
