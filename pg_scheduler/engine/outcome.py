"""Recording what became of a job that ran: the log line and metrics of each
outcome (completed, failed, retried, lease lost), writing a failed attempt,
and settling a completion the completer has written (``settle``: the claimer
then lets go of the row)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pg_scheduler.observe.instrument as instrument

from ..config import RetryPolicy
from ..store import Store
from ..store.periodic import PERIODIC_TASK_PREFIX
from ..support.codec import ERROR_MAX_CHARS, clip_text, decode_json
from ..support.log import get_logger
from .completer import write_failure
from .job import ClaimedJob, RunningJob

# The engine's log lines keep the name they had when it was one module.
log = get_logger("pg_scheduler.worker")


class Outcomes:
    """The outcomes of one worker's jobs (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        retry_policy: RetryPolicy,
        wake_after: Callable[[float], None],
        settled: Callable[[str], None],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.retry_policy = retry_policy
        self._wake_after = wake_after
        self._settled = settled
        #: "job completed" is logged (checked once per claim by the executor).
        self.log_info = True

    def fields(self, job: ClaimedJob) -> dict[str, Any]:
        """What every log line about a job carries (built only when one is written);
        a periodic job's run also its name (its task is ``periodic:<dedup key>``)."""
        fields = {
            "job_id": job.job_id,
            "task": job.task_name,
            "worker_id": self.worker_id,
            "attempt": job.attempt,
        }
        if job.task_name.startswith(PERIODIC_TASK_PREFIX):
            fields["periodic"] = job.job_name
        return fields

    def completed(self, job: ClaimedJob, written: Any, duration: float | None) -> str:
        """Log what the completion's write became (what ``Completer.queue`` settles
        with); returns the outcome: completed, failed or lost."""
        if written is True:
            if self.log_info:
                log.info(
                    "job completed", event_type="completed", duration=duration, **self.fields(job)
                )
            return "completed"
        if isinstance(written, BaseException):
            log.error(
                "completion not written; the job will be rescued and run again",
                error=repr(written),
                **self.fields(job),
            )
            return "lost"
        if written:
            log.error(
                "job failed: its result could not be stored",
                event_type="failed",
                error=written,
                duration=duration,
                **self.fields(job),
            )
            return "failed"
        log.warning(
            "job finished but its lease was lost; outcome not written",
            event_type="lease_lost",
            duration=duration,
            **self.fields(job),
        )
        return "lost"

    def settle(self, running: RunningJob, written: Any) -> None:
        """The completer wrote (or gave up on) the completion of a job whose task
        has ended: log it, tell the observers, and let the claimer let go of it."""
        try:
            outcome = self.completed(running.job, written, running.duration)
            if running.observed:
                instrument.finished(running.observed, outcome, running.duration)
        except Exception as exc:  # an observer's bug: as if the job's task had crashed
            log.error("job task crashed", error=repr(exc))
        finally:
            self._settled(running.job.job_id)

    def retry_delay(self, job: ClaimedJob) -> float | None:
        """Seconds before a failed attempt of ``job`` runs again; None: no retry left."""
        if job.attempt > job.max_retries:
            return None
        stored = decode_json(job.retry_policy)
        policy = RetryPolicy.from_stored(stored) if stored else self.retry_policy
        return policy.delay_for(job.retry_count + 1)

    async def failed(
        self,
        job: ClaimedJob,
        message: str,
        trace: str | None,
        duration: float,
        final: bool = False,
    ) -> str:
        """Write a failed attempt; what it became: retried, failed or lost.

        Always recorded while the job is this attempt's: a retry that cannot
        be computed or stored becomes a final failure saying why (see
        :func:`write_failure`), never a re-run."""
        message = clip_text(message, ERROR_MAX_CHARS)
        delay: float | None = None
        if not final:
            try:
                delay = self.retry_delay(job)
            except Exception as exc:  # a stored policy no worker can apply
                message = clip_text(
                    f"{message} [no retry: its retry_policy gives no delay ({exc!r})]",
                    ERROR_MAX_CHARS,
                )
        written = await write_failure(
            self.store, job.job_id, self.worker_id, job.attempt, message, trace, delay
        )
        if written.outcome == "retried":
            assert delay is not None
            self._wake_after(delay)
            log.warning(
                "job failed, will retry",
                event_type="retried",
                error=message,
                retry_in=round(delay, 3),
                duration=duration,
                **self.fields(job),
            )
            return "retried"
        if written.outcome == "failed":
            log.error(
                "job failed",
                event_type="failed",
                error=written.error,
                duration=duration,
                **self.fields(job),
            )
            return "failed"
        log.warning(
            "job failed but its lease was lost; outcome not written",
            event_type="lease_lost",
            error=message,
            **self.fields(job),
        )
        return "lost"
