"""``ctx.step``: run a function once, store its result, replay it afterwards;
retried in the run by its own :class:`StepRetry`."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pg_scheduler.observe.instrument as instrument

from ..support.codec import ERROR_MAX_CHARS, clip_text
from .errors import StepFailed
from .replay import COMPLETED, FAILED
from .run import RunState, encode_step_result


@dataclass(frozen=True, slots=True)
class StepRetry:
    """How often a step is tried before it fails, and the pauses between tries.

    Attempt ``n`` (from 1) that fails is followed by a pause of
    ``min(max_delay, initial_delay * backoff ** (n - 1))`` seconds, spent in
    the run (the workflow holds its slot meanwhile: keep pauses short, and
    use ``ctx.sleep`` for long ones). Distinct from the workflow's own
    ``max_retries`` / ``retry_policy``, which apply when the workflow fails.
    """

    max_attempts: int = 3
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("initial_delay", "backoff", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.backoff < 1:
            raise ValueError(f"backoff must be >= 1, got {self.backoff!r}")

    def delay(self, failed: int) -> float:
        """Seconds to pause after attempt ``failed`` (1-based) failed."""
        return float(min(self.max_delay, self.initial_delay * self.backoff ** (failed - 1)))


ONCE = StepRetry(max_attempts=1, initial_delay=0.0)


def check_step_options(retry: Any, timeout: Any) -> None:
    if retry is not None and not isinstance(retry, StepRetry):
        raise TypeError(f"retry must be a StepRetry, got {retry!r}")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < math.inf
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


async def call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``, awaited if it returns an awaitable."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


async def run_step(
    run: RunState,
    name: str,
    key: str,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    retry: StepRetry | None,
    timeout: float | None,
) -> Any:
    """The step's result: recorded, or computed now and recorded."""
    run.check()
    seq, record = run.take("step", name, key)
    if record is not None:
        if record.status == COMPLETED:
            return record.result
        if record.status == FAILED and not run.replay.is_last(seq):
            # The workflow went on after this failure: replay it as it was.
            raise StepFailed(name, key, record.error or "", record.attempts)
    policy = retry or ONCE
    started = run.now()
    opener = instrument.span_opener
    if opener is None:
        return await _run(run, seq, name, key, fn, args, kwargs, policy, timeout, started)
    attributes = {"pg_scheduler.step": name, "pg_scheduler.step_key": key, "pg_scheduler.seq": seq}
    with opener(f"step {name}", attributes, False):
        return await _run(run, seq, name, key, fn, args, kwargs, policy, timeout, started)


async def _run(
    run: RunState,
    seq: int,
    name: str,
    key: str,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    policy: StepRetry,
    timeout: float | None,
    started: Any,
) -> Any:
    """Run the step's function (again, per ``policy``) and record its outcome."""
    attempt = 0
    while True:
        attempt += 1
        try:
            if timeout is None:
                value = await call(fn, args, kwargs)
            else:
                try:
                    async with asyncio.timeout(timeout):
                        value = await call(fn, args, kwargs)
                except TimeoutError as exc:
                    raise TimeoutError(f"step timed out after {timeout:g} s") from exc
            break
        except Exception as exc:
            run.check()
            if attempt >= policy.max_attempts:
                error = clip_text(f"{type(exc).__name__}: {exc}", ERROR_MAX_CHARS)
                await run.record(seq, "step", name, key, FAILED, None, error, attempt, started)
                raise StepFailed(name, key, error, attempt) from exc
            await asyncio.sleep(policy.delay(attempt))
    text = encode_step_result(f"step {name!r}", value)
    made = await run.record(seq, "step", name, key, COMPLETED, text, None, attempt, started)
    if made.status == FAILED:  # another run recorded its failure first
        raise StepFailed(name, key, made.error or "", made.attempts)
    return made.result
