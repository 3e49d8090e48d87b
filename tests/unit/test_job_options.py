"""One declaration of a job's keywords (enqueue/fields.py JobOptions) and of a
task's (tasks.py TaskOptions): every public signature that lists them for its
users has exactly their names and defaults, hands every one of them over, and
no other module declares them again. A keyword added to, renamed in or given
another default in one place and not the others fails here."""

from __future__ import annotations

import ast
import gc
import inspect
import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import pg_scheduler.tasks as tasks_module
import pg_scheduler.workflows.decorator as workflows_decorator
from pg_scheduler import (
    JobPriority,
    JobSpec,
    RetryPolicy,
    Scheduler,
    SyncClient,
    task,
)
from pg_scheduler.config import UNSET
from pg_scheduler.enqueue.fields import OPTION_DEFAULTS, OPTION_NAMES, JobOptions, check_job
from pg_scheduler.tasks import TASK_OPTION_NAMES, TaskOptions

PACKAGE = Path(__file__).resolve().parents[2] / "pg_scheduler"

# The keywords of schedule() that are not a job's fields: how and where to write it.
HOW = {"conflict_resolution", "connection"}
# A job's function, its arguments and its time: not options, but the same everywhere.
CALL = {"execution_time": None, "args": (), "kwargs": None}
TASK_DEFAULTS = {name: getattr(TaskOptions(), name) for name in TASK_OPTION_NAMES}


async def deliver(to: str = "", **extra: Any) -> str:
    return to


def _parse(path: Path) -> ast.Module:
    """Parsed with the garbage collector held off (see tests/unit/test_house.py)."""
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        gc.enable()


def keywords(func: Any) -> dict[str, Any]:
    """name -> default of each parameter but ``self`` and the function."""
    return {
        p.name: p.default
        for p in inspect.signature(func).parameters.values()
        if p.name not in ("self", "func")
    }


def same_default(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def assert_options_declared(found: dict[str, Any], defaults: dict[str, Any]) -> None:
    assert set(found) == set(defaults)
    wrong = {n: (found[n], d) for n, d in defaults.items() if not same_default(found[n], d)}
    assert wrong == {}, "defaults that differ from the declaration (found, declared)"


def test_the_declaration_is_what_the_readme_documents() -> None:
    assert OPTION_NAMES == (
        "priority",
        "max_retries",
        "job_id",
        "misfire_grace_time",
        "timeout",
        "retry_policy",
        "dedupe_key",
        "dedupe_scope",
        "queue",
        "depends_on",
        "on_dependency_failure",
        "delay",
        "concurrency_key",
        "max_running_per_key",
        "rate_limit_per_key",
        "ordered",
        "debounce",
        "debounce_max_wait",
        "throttle",
        "fair_share_key",
        "fair_share_weight",
    )
    assert OPTION_DEFAULTS["priority"] is JobPriority.NORMAL
    assert OPTION_DEFAULTS["depends_on"] is None
    assert OPTION_DEFAULTS["on_dependency_failure"] == "cancel"
    assert OPTION_DEFAULTS["misfire_grace_time"] is UNSET
    assert dict(OPTION_DEFAULTS) == {n: getattr(JobOptions(), n) for n in OPTION_NAMES}


@pytest.mark.parametrize("method", [Scheduler.schedule, SyncClient.schedule], ids=repr)
def test_schedule_signatures_are_the_declaration(method: Any) -> None:
    params = inspect.signature(method).parameters
    assert all(p.kind is p.KEYWORD_ONLY for n, p in params.items() if n not in ("self", "func"))
    found = keywords(method)
    assert set(found) - HOW - set(CALL) == set(OPTION_NAMES)
    assert_options_declared({n: found[n] for n in OPTION_NAMES}, dict(OPTION_DEFAULTS))
    assert {n: found[n] for n in CALL} == CALL


def test_jobspec_takes_the_options_positionally_in_declaration_order() -> None:
    params = list(inspect.signature(JobSpec.__init__).parameters.values())[1:]
    assert [p.name for p in params] == ["func", *CALL, *OPTION_NAMES]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
    found = keywords(JobSpec.__init__)
    assert_options_declared({n: found[n] for n in OPTION_NAMES}, dict(OPTION_DEFAULTS))
    assert {n: found[n] for n in CALL} == CALL
    assert JobSpec.__slots__ == ("func", *CALL, *OPTION_NAMES)


def test_schedule_job_keeps_its_0_2_signature_and_otherwise_the_declaration() -> None:
    """0.2.x: positional by name, ``misfire_grace_time=None`` meaning the
    scheduler's default, no timeout or retry policy; the newer options
    keyword-only with the declared defaults."""
    params = list(inspect.signature(Scheduler.schedule_job).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [
        "job_name",
        "execution_time",
        "task_data",
        "priority",
        "max_retries",
        "job_id",
        "conflict_resolution",
        "misfire_grace_time",
    ]
    assert [p.name for p in params if p.kind is p.KEYWORD_ONLY] == [
        "dedupe_key",
        "dedupe_scope",
        "queue",
        "depends_on",
        "on_dependency_failure",
        "delay",
        "concurrency_key",
        "max_running_per_key",
        "rate_limit_per_key",
        "ordered",
        "fair_share_key",
        "fair_share_weight",
    ]
    assert params[1].default is None and params[2].default is None  # execution_time, task_data
    found = keywords(Scheduler.schedule_job)
    options = {n: d for n, d in found.items() if n in OPTION_NAMES}
    # Debounce and throttle need the task's function (schedule()).
    assert set(OPTION_NAMES) - set(options) == {
        "timeout",
        "retry_policy",
        "debounce",
        "debounce_max_wait",
        "throttle",
    }
    assert options.pop("misfire_grace_time") is None
    assert_options_declared(options, {n: OPTION_DEFAULTS[n] for n in options})


def _overloads(func: Any) -> list[Any]:
    return list(typing.get_overloads(func))


@pytest.mark.parametrize(
    "signature",
    [Scheduler.task, tasks_module.task, *_overloads(tasks_module.task)],
    ids=["Scheduler.task", "task", "task overload 1", "task overload 2"],
)
def test_task_signatures_are_the_declaration(signature: Any) -> None:
    found = keywords(signature)
    if not found:
        return  # ``@task`` bare: the function only
    assert_options_declared(found, TASK_DEFAULTS)


def test_the_task_overloads_are_both_there() -> None:
    assert len(_overloads(tasks_module.task)) == 2


# -- every keyword is handed over ----------------------------------------------------

#: A value other than the default for each option (a new option needs one here).
OTHER = {
    "priority": JobPriority.HIGH,
    "max_retries": 3,
    "job_id": "job-1",
    "misfire_grace_time": 17,
    "timeout": 2.5,
    "retry_policy": RetryPolicy(base_delay=5),
    "dedupe_key": "k",
    "dedupe_scope": "pending",
    "queue": "emails",
    "depends_on": ["job-0"],
    "on_dependency_failure": "run",
    "delay": timedelta(seconds=30),
    "concurrency_key": "acct",
    "max_running_per_key": 1,
    "rate_limit_per_key": "10/s",
    "ordered": True,
    "debounce": timedelta(seconds=5),
    "debounce_max_wait": 60,
    "throttle": 1.5,
    "fair_share_key": "tenant-a",
    "fair_share_weight": 2.5,
}
TASK_OTHER = {
    "name": "emails.deliver",
    "executor": "thread",
    "dedupe_key": "k",
    "dedupe_scope": "pending",
    "max_running": 2,
    "rate_limit": "10/s",
    "queue": "emails",
    "concurrency_key": "acct",
    "max_running_per_key": 1,
    "rate_limit_per_key": "10/s",
    "ordered": True,
    "debounce": timedelta(seconds=5),
    "debounce_max_wait": timedelta(seconds=60),
    "debounce_merge": max,
    "throttle": timedelta(seconds=60),  # handed over only: a task takes one of the two
    "batch_size": 50,
    "batch_timeout": timedelta(seconds=2),
    "fair_share_key": "tenant-a",
    "fair_share_weight": 3,
}
#: Task options a workflow does not take: it runs on the loop, one job at a time.
NOT_WORKFLOW = ("executor", "batch_size", "batch_timeout")


def test_every_option_has_another_value_here() -> None:
    assert set(OTHER) == set(OPTION_NAMES)
    assert set(TASK_OTHER) == set(TASK_OPTION_NAMES)
    assert all(not same_default(OTHER[n], OPTION_DEFAULTS[n]) for n in OPTION_NAMES)


class Recorder:
    """Stands in for the producer's entry points: keeps what each was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _keep(self, name: str) -> Any:
        def keep(*args: Any) -> str:
            self.calls.append((name, args))
            return "id"

        return keep

    def __getattr__(self, name: str) -> Any:
        return self._keep(name)


class AsyncRecorder(Recorder):
    def _keep(self, name: str) -> Any:
        sync = super()._keep(name)

        async def keep(*args: Any) -> str:
            return sync(*args)  # type: ignore[no-any-return]

        return keep


def handed_options(recorder: Recorder) -> JobOptions:
    [(_, args)] = recorder.calls
    [options] = [a for a in args if isinstance(a, JobOptions)]
    return options


WHEN = datetime(2031, 1, 2, tzinfo=UTC)


async def test_scheduler_schedule_hands_over_every_option() -> None:
    host = SimpleNamespace(_jobs=AsyncRecorder())
    await Scheduler.schedule(host, deliver, **OTHER)  # type: ignore[arg-type]
    assert handed_options(host._jobs) == JobOptions(**OTHER)


async def test_schedule_job_hands_over_every_option_it_takes() -> None:
    host = SimpleNamespace(enqueuer=AsyncRecorder())
    left_out = ("timeout", "retry_policy", "debounce", "debounce_max_wait", "throttle")
    given = {n: v for n, v in OTHER.items() if n not in left_out}
    await Scheduler.schedule_job(host, "emails:deliver", None, {}, **given)  # type: ignore[arg-type]
    assert handed_options(host.enqueuer) == JobOptions(**given)


def test_sync_client_schedule_hands_over_every_option() -> None:
    client = SyncClient("postgresql://unused")  # opens nothing until its own pool is used
    recorder = Recorder()
    client._callers = recorder  # type: ignore[assignment]
    client.schedule(deliver, connection=object(), **OTHER)
    assert handed_options(recorder) == JobOptions(**OTHER)


def test_both_task_decorators_hand_over_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Recorder()
    Scheduler.task(SimpleNamespace(registry=registry), **TASK_OTHER)  # type: ignore[arg-type]
    monkeypatch.setattr(tasks_module, "default_registry", registry)
    task(**TASK_OTHER)
    handed = [args[1] for _, args in registry.calls]
    assert handed == [TaskOptions(**TASK_OTHER)] * 2


# -- one check of every option ---------------------------------------------------------

#: A bad value of each option and the error it raises (a new option needs one here).
BAD = {
    "priority": (7, TypeError),
    "max_retries": (-1, ValueError),
    "job_id": ("", ValueError),
    "misfire_grace_time": ("5", TypeError),
    "timeout": (0, ValueError),
    "retry_policy": (5, TypeError),
    "dedupe_key": (5, TypeError),
    "dedupe_scope": ("forever", ValueError),
    "queue": ("no spaces", ValueError),
    "depends_on": ("job-0", TypeError),
    "on_dependency_failure": ("ignore", ValueError),
    "delay": (timedelta(seconds=-5), ValueError),
    "concurrency_key": (5, TypeError),
    "max_running_per_key": (0, ValueError),
    "rate_limit_per_key": ("10/x", ValueError),
    "ordered": ("yes", TypeError),
    "debounce": (timedelta(0), ValueError),
    "debounce_max_wait": ("5", TypeError),
    "throttle": (-1, ValueError),
    "fair_share_key": (5, TypeError),
    "fair_share_weight": (0, ValueError),
}


def test_every_option_has_a_bad_value_here() -> None:
    assert set(BAD) == set(OPTION_NAMES)


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_check_job_checks_every_option(name: str) -> None:
    value, error = BAD[name]
    with pytest.raises(error, match=name):
        check_job(None, JobOptions(**{name: value}))
    check_job(None, JobOptions(**{name: OTHER[name]}))  # a good value passes


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_jobspec_checks_every_option_alone(name: str) -> None:
    """One bad option and every other at its default (JobSpec's fast path)."""
    value, error = BAD[name]
    with pytest.raises(error, match=name):
        JobSpec(deliver, **{name: value})
    spec = JobSpec(deliver, **{name: OTHER[name]})
    assert getattr(spec, name) == OTHER[name]


def test_jobspec_keeps_every_option() -> None:
    spec = JobSpec(deliver, None, ("a",), {"b": 1}, **OTHER)
    assert {n: getattr(spec, n) for n in OPTION_NAMES} == OTHER
    assert JobOptions.of({n: getattr(spec, n) for n in OPTION_NAMES}) == JobOptions(**OTHER)


# -- no second declaration ----------------------------------------------------------

#: Modules and names that may list four or more of a job's options, and why.
MAY_LIST_JOB_OPTIONS = {
    "enqueue/fields.py:JobOptions": "the declaration",
    "scheduler.py:schedule": "public signature, tested above",
    "sync_client.py:schedule": "public signature, tested above",
    "job_spec.py:__init__": "public signature, tested above",
    "scheduler.py:schedule_job": "0.2.x public signature, tested above",
    "models.py:Job": "a stored job as read back (its columns), not a way in",
    "store/jobs.py:NewJob": "the row's columns (the store's vocabulary)",
    "engine/job.py:ClaimedJob": "a claimed row as the engine runs it",
    "periodic/registry.py:PeriodicJobConfig": "a periodic job's declaration",
    "periodic/registry.py:periodic": "@periodic's public signature",
    "workflows/context.py:spawn": "ctx.spawn's public signature: a child's options (tested below)",
    "workflows/decorator.py:workflow": "@workflow's public signature: a task's options (below)",
    "tasks.py:TaskOptions": "a task's options: its jobs' defaults (queue, keys, debounce, ...)",
    "tasks.py:task": "@task's public signature: a task's options (tested above)",
    "scheduler.py:task": "Scheduler.task's public signature: a task's options (tested above)",
    "store/workflows.py:Spawned": "a child's row as the spawn statement writes it",
    "enqueue/fields.py:JobFields": "a job's resolved fields (the call's, else the task's)",
    "enqueue/queue_keys.py:queue_keys": "a queue's key defaults: its public signature",
    "enqueue/queue_keys.py:QueueKeys": "a queue's declared key defaults, as kept",
}
#: The same for a task's options.
MAY_LIST_TASK_OPTIONS = {
    "tasks.py:TaskOptions": "the declaration",
    "tasks.py:task": "public signature (and its overloads), tested above",
    "scheduler.py:task": "public signature, tested above",
    "workflows/decorator.py:workflow": "@workflow's public signature (and its overloads), below",
}


def _declarations(least: int, names: set[str]) -> set[str]:
    """``path:name`` of each function signature or class body (annotated
    fields) in the package that declares at least ``least`` of ``names``."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                declared = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
            elif isinstance(node, ast.ClassDef):
                declared = {
                    b.target.id
                    for b in node.body
                    if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
                }
            else:
                continue
            if len(declared & names) >= least:
                found.add(f"{path.relative_to(PACKAGE)}:{node.name}")
    return found


def test_no_other_module_declares_a_jobs_options() -> None:
    found = _declarations(4, set(OPTION_NAMES))
    assert "enqueue/fields.py:JobOptions" in found  # the scan sees the declaration
    assert found - set(MAY_LIST_JOB_OPTIONS) == set(), "use JobOptions, or list it here with why"
    assert set(MAY_LIST_JOB_OPTIONS) - found == set(), "listed here but gone: drop it"


def test_no_other_module_declares_a_tasks_options() -> None:
    found = _declarations(3, {"executor", "max_running", "rate_limit", "dedupe_scope"})
    assert "tasks.py:TaskOptions" in found
    assert found - set(MAY_LIST_TASK_OPTIONS) == set(), "use TaskOptions, or list it here with why"
    assert set(MAY_LIST_TASK_OPTIONS) - found == set(), "listed here but gone: drop it"


# -- workflows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signature",
    [workflows_decorator.workflow, *_overloads(workflows_decorator.workflow)],
    ids=["workflow", "workflow overload 1", "workflow overload 2"],
)
def test_the_workflow_decorator_takes_the_task_options_but_executor(signature: Any) -> None:
    found = keywords(signature)
    if not found:
        return  # ``@workflow`` bare
    assert found.pop("timeout") is None
    assert_options_declared(
        found, {n: d for n, d in TASK_DEFAULTS.items() if n not in NOT_WORKFLOW}
    )


def test_the_workflow_decorator_hands_over_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Recorder()
    monkeypatch.setattr(workflows_decorator, "default_registry", registry)

    async def flow(ctx: Any) -> None: ...

    given = {n: v for n, v in TASK_OTHER.items() if n not in NOT_WORKFLOW}
    workflows_decorator.workflow(**given)(flow)
    [(_, args)] = registry.calls
    assert args[1] == TaskOptions(**given)


def test_spawn_takes_a_childs_options_with_their_declared_defaults() -> None:
    from pg_scheduler.workflows.context import WorkflowContext

    found = keywords(WorkflowContext.spawn)
    assert found.pop("args") is inspect.Parameter.empty  # *args
    assert found.pop("kwargs") is inspect.Parameter.empty  # **kwargs
    assert found.pop("detached") is False
    # The parent's priority unless given; the rest as declared. A child's id,
    # misfire grace and dedupe key are not the caller's to give; it starts now;
    # a child waits for no declared dependency (its parent waits for it), and
    # is neither debounced nor throttled (one spawn, one child).
    assert found.pop("priority") is None
    assert set(found) | {
        "priority",
        "job_id",
        "misfire_grace_time",
        "dedupe_key",
        "dedupe_scope",
        "depends_on",
        "on_dependency_failure",
        "delay",
        "debounce",
        "debounce_max_wait",
        "throttle",
    } == set(OPTION_NAMES)
    assert_options_declared(found, {n: OPTION_DEFAULTS[n] for n in found})


def test_a_spawn_that_gives_no_option_has_the_shared_default_options() -> None:
    """ctx.spawn skips building JobOptions when no option is given and uses
    SPAWN_DEFAULTS instead: they must be what its signature's defaults build,
    and the skip must test every option the signature takes."""
    from pg_scheduler.workflows.children import SPAWN_DEFAULTS
    from pg_scheduler.workflows.context import WorkflowContext

    signature = inspect.signature(WorkflowContext.spawn)
    defaults = {
        name: p.default
        for name, p in signature.parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert JobOptions.of(defaults) == SPAWN_DEFAULTS
    test = inspect.getsource(WorkflowContext.spawn).split("if (", 1)[1].split("):", 1)[0]
    tested = {
        line.strip().removeprefix("and ").removeprefix("type(").split(" ")[0].rstrip(")")
        for line in test.splitlines()
    }
    assert {name for name in OPTION_NAMES if name in defaults} == tested - {""}
