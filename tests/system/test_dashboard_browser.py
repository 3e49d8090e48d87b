"""The dashboard in a real browser: Debian's chromium driven through chromedriver.

Skipped, saying why, where either is missing (CI installs ``chromium
chromium-driver``). With PG_SCHEDULER_DASHBOARD_SCREENSHOTS=DIR set, the page
test saves DIR/dashboard-<page>.png (the screenshots of docs/dashboard.md come from here).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pg_scheduler import RetryPolicy
from pg_scheduler.dashboard import dashboard_app
from tests.support import dashboard_tasks, workflow_view_tasks
from tests.support.common import wait_for_status, wait_until
from tests.support.dashboard_support import Browser, browser_missing, chromium, serve

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

TOKEN = "browser-token"
FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0)
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture(scope="module")
async def browser():
    async with chromium() as b:
        yield b


@pytest.fixture
async def site(pool):
    app = dashboard_app(pool, token=TOKEN, poll_seconds=30)
    async with serve(app) as url:
        yield url
    await app.state.dashboard.close()


@pytest.fixture
async def readonly_site(pool):
    app = dashboard_app(pool, poll_seconds=30)
    async with serve(app) as url:
        yield url
    await app.state.dashboard.close()


async def load(browser: Browser, url: str) -> None:
    """Open ``url`` and wait until the page has rendered its data."""
    await browser.open(url)

    async def rendered() -> bool:
        return bool(await browser.js("return document.getElementById('main').dataset.loaded"))

    await wait_until(rendered, timeout=20, message=f"{url} to render")
    error = await browser.text("[data-error]")
    assert error is None, f"{url}: {error}"


async def shows(browser: Browser, selector: str, text: str, timeout: float = 20) -> None:
    async def matches() -> bool:
        return (await browser.text(selector) or "").strip() == text

    await wait_until(matches, timeout=timeout, message=f"{selector} to show {text!r}")


async def set_token(browser: Browser, token: str) -> None:
    await browser.js("sessionStorage.setItem('pg_scheduler_token', arguments[0])", token)


async def test_each_page_loads(browser, site, pool, make_scheduler):
    dashboard_tasks.gate.clear()
    scheduler = await make_scheduler()
    done = [
        await scheduler.schedule(dashboard_tasks.echo, execution_time=now(), args=(n,))
        for n in range(6)
    ]
    failed = await scheduler.schedule(
        dashboard_tasks.boom,
        execution_time=now(),
        args=("disk full",),
        max_retries=1,
        retry_policy=FAST_RETRY,
    )
    running = await scheduler.schedule(dashboard_tasks.gated, execution_time=now(), args=(1,))
    await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(hours=1), args=("later",)
    )
    for job_id in done:
        await wait_for_status(pool, job_id, "completed")
    await wait_for_status(pool, failed, "failed")
    await wait_for_status(pool, running, "running")
    await pool.execute(
        """
        INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule, enabled,
                                   code_enabled, next_run, last_run, last_outcome)
        VALUES ('nightly-report', 'nightly_report', 'periodic:nightly-report',
                'cron 0 3 * * * UTC', true, true, now() + interval '5 hours',
                now() - interval '19 hours', 'completed')
        """
    )
    shots = os.environ.get("PG_SCHEDULER_DASHBOARD_SCREENSHOTS")
    pages = [
        ("overview", "/", "[data-count=completed]", "6"),
        ("jobs", "/jobs", f"tr[data-job-id='{failed}'] [data-status]", "failed"),
        ("job", f"/job?id={failed}", "[data-field=status]", "failed"),
        ("workers", "/workers", f"tr[data-worker='{scheduler.worker_id}'] [data-running]", None),
        ("queues", "/queues", "tr[data-queue=default] td", "default"),
        ("periodic", "/periodic", "tr[data-periodic=nightly-report] td", "nightly_report"),
    ]
    for name, path, selector, text in pages:
        await load(browser, site + path)
        if text is None:
            assert await browser.text(selector) is not None, name
        else:
            await shows(browser, selector, text)
        if shots:
            await asyncio.to_thread(Path(shots).mkdir, parents=True, exist_ok=True)
            await browser.screenshot(Path(shots) / f"dashboard-{name}.png")
    dashboard_tasks.gate.set()
    await wait_for_status(pool, running, "completed")


async def test_live_counts_change_as_jobs_run(browser, site, pool, make_scheduler):
    dashboard_tasks.gate.clear()
    await load(browser, site + "/")
    await shows(browser, "[data-count=running]", "0")
    await shows(browser, "#live", "live")
    scheduler = await make_scheduler()
    ids = [
        await scheduler.schedule(dashboard_tasks.gated, execution_time=now(), args=(n,))
        for n in range(3)
    ]
    # No reload: the page follows the events (it polls only every 30 s here).
    await shows(browser, "[data-count=running]", "3")
    dashboard_tasks.gate.set()
    await shows(browser, "[data-count=completed]", "3")
    await shows(browser, "[data-count=running]", "0")
    for job_id in ids:
        await wait_for_status(pool, job_id, "completed")


async def test_cancel_and_retry_with_the_token(browser, site, pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(hours=1), args=("x",)
    )
    await load(browser, f"{site}/job?id={job_id}")
    await set_token(browser, TOKEN)
    await shows(browser, "[data-field=status]", "pending")
    await browser.click("button[data-action=cancel]")
    await wait_for_status(pool, job_id, "cancelled")
    await shows(browser, "[data-field=status]", "cancelled")
    await browser.click("button[data-action=retry]")
    await wait_for_status(pool, job_id, "pending")
    await shows(browser, "[data-field=status]", "pending")
    # The jobs list's buttons work too.
    await load(browser, f"{site}/jobs?status=pending")
    await browser.click(f"tr[data-job-id='{job_id}'] button[data-action=cancel]")
    await wait_for_status(pool, job_id, "cancelled")


async def test_a_wrong_token_is_refused(browser, site, pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(hours=1), args=("x",)
    )
    await load(browser, f"{site}/job?id={job_id}")
    await set_token(browser, "not-the-token")
    await browser.click("button[data-action=cancel]")

    async def refused() -> bool:
        return "token is required" in (await browser.text("#toast") or "")

    await wait_until(refused, message="the refusal to show")
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
        == "pending"
    )


async def test_read_only_mode_disables_actions(browser, readonly_site, pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(hours=1), args=("x",)
    )
    for path in (f"/job?id={job_id}", "/jobs"):
        await load(browser, readonly_site + path)
        assert await browser.text("#mode") == "read-only"
        assert await browser.js("return document.getElementById('token').hidden") is True
        buttons = await browser.js(
            "return [...document.querySelectorAll('main button[data-action]')]"
            ".map((b) => [b.dataset.action, b.disabled, b.title])"
        )
        assert buttons, path
        for action, disabled, title in buttons:
            assert disabled is True, (path, action)
            assert "read-only" in title, (path, action)
    await browser.click("button[data-action=cancel]")  # a disabled button does nothing
    # The server refuses the action all the same, whatever the page does.
    response = await browser.js(
        "const x = new XMLHttpRequest(); x.open('POST', '/api/action/cancel', false);"
        "x.setRequestHeader('Content-Type', 'application/json');"
        "x.send(JSON.stringify({job_id: arguments[0]})); return [x.status, x.responseText];",
        job_id,
    )
    assert response[0] == 403 and "read-only" in response[1]
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
        == "pending"
    )


async def test_markup_in_a_job_is_shown_as_text(browser, site, pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(dashboard_tasks.boom, execution_time=now(), args=(EVIL,))
    await wait_for_status(pool, job_id, "failed")
    for path in ("/jobs", f"/job?id={job_id}"):
        await load(browser, site + path)
        assert await browser.js("return window.__pwned === undefined") is True, path
        assert (
            await browser.js("return document.querySelectorAll('main script, main img').length")
            == 0
        )
    arguments = await browser.text("[data-field=arguments]")
    assert "<script>window.__pwned = 1</script>" in arguments


async def test_polling_fallback_updates_counts(browser, pool):
    app = dashboard_app(pool, pgbouncer=True, poll_seconds=0.5)  # no events: polling only
    try:
        async with serve(app) as url:
            await load(browser, url + "/")
            await shows(browser, "#live", "polling")
            await shows(browser, "[data-count=pending]", "0")
            await pool.execute(
                "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time) "
                "VALUES ('poll-1', 't', 't', now() + interval '1 hour')"
            )
            await shows(browser, "[data-count=pending]", "1")
    finally:
        await app.state.dashboard.close()


async def test_a_workflow_job_page_shows_steps_children_and_its_wait(
    browser, site, pool, make_scheduler
):
    workflow_view_tasks.gate.clear()
    scheduler = await make_scheduler()
    try:
        parent = await scheduler.schedule(
            workflow_view_tasks.fan_out, execution_time=now(), args=([1, 2, 3],)
        )
        sleeping = await scheduler.schedule(
            workflow_view_tasks.sleeper, execution_time=now(), args=(5,)
        )
        await wait_for_status(pool, parent, "waiting")
        await wait_for_status(pool, sleeping, "waiting")
        children = [
            r["job_id"]
            for r in await pool.fetch(
                "SELECT job_id FROM scheduled_jobs WHERE parent_job_id = $1 ORDER BY parent_seq",
                parent,
            )
        ]
        for child in children:
            await wait_for_status(pool, child, "running")

        await load(browser, f"{site}/job?id={parent}")
        await shows(browser, "[data-field=status]", "waiting")
        await shows(browser, "[data-field='waits for']", "3 children to end")
        await shows(browser, "[data-section=steps]", "Steps (5)")
        assert await browser.js("return document.querySelectorAll('tr[data-step]').length") == 5
        await shows(browser, "tr[data-step='2'] [data-status]", "waiting")
        await shows(browser, "tr[data-step='1'] [data-status]", "completed")
        await shows(browser, "[data-section=children]", "Children (3)")
        await shows(browser, "[data-child-status=running]", "running 3")
        for child in children:
            await shows(browser, f"tr[data-child='{child}'] td a", child)
        colour = await browser.js(
            "return getComputedStyle(document.querySelector(arguments[0])).color",
            "tr[data-step='2'] [data-status]",
        )
        assert colour == "rgb(123, 79, 196)"  # the waiting colour
        shots = os.environ.get("PG_SCHEDULER_DASHBOARD_SCREENSHOTS")
        if shots:
            await asyncio.to_thread(Path(shots).mkdir, parents=True, exist_ok=True)
            await browser.screenshot(Path(shots) / "dashboard-workflow.png")

        # A child links back to its parent.
        await load(browser, f"{site}/job?id={children[0]}")
        await shows(browser, "[data-field=parent] a", parent)
        assert await browser.text("[data-section=steps]") is None
        await browser.click("[data-field=parent] a")
        await shows(browser, "[data-section=children]", "Children (3)")

        # A sleeping workflow: its wake time, its steps' results (a long one clipped).
        await load(browser, f"{site}/job?id={sleeping}")
        wait_text = await browser.text("[data-field='waits for']")
        assert wait_text is not None and wait_text.startswith("sleep, wakes ")
        assert wait_text.endswith(("in 2 h", "in 120 min")), wait_text
        clipped = await browser.text("tr[data-step='2'] [data-clipped]")
        assert clipped is not None and "characters" in clipped

        # The lists: a filter for waiting, its own count on the overview.
        await load(browser, f"{site}/jobs?status=waiting")
        await shows(browser, f"tr[data-job-id='{parent}'] [data-status]", "waiting")
        await shows(browser, f"tr[data-job-id='{parent}'] [data-wait]", "3 children to end")
        assert await browser.js("return document.querySelectorAll('tr[data-job-id]').length") == 2
        await load(browser, f"{site}/")
        await shows(browser, "[data-count=waiting]", "2")

        # The children end: the parent's page follows.
        workflow_view_tasks.gate.set()
        await wait_for_status(pool, parent, "completed")
        await load(browser, f"{site}/job?id={parent}")
        await shows(browser, "[data-child-status=completed]", "completed 3")
        assert await browser.text("[data-field='waits for']") is None
    finally:
        workflow_view_tasks.gate.set()


async def test_many_pages_in_a_row_each_load_at_once(browser, site, pool, make_scheduler):
    # Each page holds a live stream; a page left must let its connection go, or
    # the browser (a few connections per server) stalls the next pages.
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(hours=1), args=("x",)
    )
    paths = ["/", "/jobs", f"/job?id={job_id}", "/workers", "/queues", "/periodic"] * 2
    for path in paths:
        started = time.monotonic()
        await load(browser, site + path)
        assert time.monotonic() - started < 10, f"{path} took {time.monotonic() - started:.1f}s"
    await shows(browser, "#live", "live")


async def fake_worker(pool, *tasks: str) -> None:
    """A live worker's row listing ``tasks`` (nothing claims: no process behind it)."""
    await pool.execute(
        "INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks) "
        "VALUES ('w-' || md5(random()::text), 'host', 1, 4, $1::text[])",
        list(tasks),
    )


async def due_job(pool, job_id: str, task: str, minutes_ago: float, **columns) -> None:
    names = "".join(f", {k}" for k in columns)
    values = "".join(f", ${n}" for n in range(4, 4 + len(columns)))
    await pool.execute(
        f"INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time{names}) "
        f"VALUES ($1, $2, $2, now() - make_interval(mins => $3){values})",
        job_id,
        task,
        minutes_ago,
        *columns.values(),
    )


async def save_shot(browser: Browser, name: str) -> None:
    shots = os.environ.get("PG_SCHEDULER_DASHBOARD_SCREENSHOTS")
    if shots:
        await asyncio.to_thread(Path(shots).mkdir, parents=True, exist_ok=True)
        await browser.screenshot(Path(shots) / f"dashboard-{name}.png")


async def test_orphans_have_their_panel_and_stay_out_of_the_oldest_wait(
    browser, site, readonly_site, pool
):
    await load(browser, readonly_site + "/")  # another app: its overview is cached apart
    await shows(browser, "[data-section=orphans] h3", "Orphaned work: none")
    await fake_worker(pool, "dash.echo")
    await due_job(pool, "served-1", "dash.echo", 10)
    await due_job(pool, "ghost-1", "ghost.task", 180)
    await due_job(pool, "ghost-2", "ghost.task", 90)
    await pool.execute(
        "INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule, next_run) "
        "VALUES ('gone', 'gone_report', 'periodic:gone', 'every 60s', now())"
    )
    await load(browser, site + "/")
    await shows(browser, "[data-section=orphans] h3", "Orphaned work")
    await shows(browser, "[data-count=due]", "3")
    await shows(browser, "[data-count=orphaned]", "2")
    oldest = await browser.text("[data-count=oldest]")
    assert oldest is not None and oldest.endswith(" min") and 9 <= float(oldest.split()[0]) < 12
    await shows(browser, "tr[data-orphan-task='ghost.task'] [data-orphan-due]", "2")
    await shows(browser, "tr[data-orphan-task='ghost.task'] .time", "3 h ago")
    await shows(browser, "tr[data-orphan-periodic=gone] td", "gone_report")
    help_text = await browser.js(
        "return document.querySelector('[data-count=oldest]').parentNode.title"
    )
    assert "orphaned" in help_text


async def test_a_failed_jobs_page_opens_on_its_error_and_traceback(
    browser, site, pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        dashboard_tasks.boom,
        execution_time=now(),
        args=("disk full",),
        max_retries=1,
        retry_policy=FAST_RETRY,
    )
    await wait_for_status(pool, job_id, "failed")
    await load(browser, f"{site}/job?id={job_id}")
    await shows(browser, "[data-field=status]", "failed")
    error = await browser.text("[data-section=failure] [data-field=error]")
    assert error is not None and "disk full" in error
    traceback = await browser.text("[data-section=failure] [data-field=traceback]")
    assert traceback is not None and "Traceback" in traceback and "disk full" in traceback
    # Before the fields, the arguments and the attempts, and shown once.
    order = await browser.js(
        "const main = document.getElementById('main');"
        "const at = (s) => [...main.querySelectorAll('*')].indexOf(main.querySelector(s));"
        "return [at('[data-section=failure]'), at('dl.fields'), at('[data-field=arguments]')];"
    )
    assert 0 <= order[0] < order[1] < order[2], order
    assert await browser.js("return document.querySelectorAll('main pre').length") >= 3
    shown = await browser.js(
        "return [...document.querySelectorAll('main pre')].filter("
        "(p) => p.textContent.startsWith('Traceback') && !p.closest('table')).length"
    )
    assert shown == 1
    await save_shot(browser, "failed-job")
    # A pending job's page has no such section.
    other = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(hours=1), args=("x",)
    )
    await load(browser, f"{site}/job?id={other}")
    assert await browser.text("[data-section=failure]") is None


async def test_times_are_relative_with_the_exact_time_on_hover(browser, site, pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() + timedelta(minutes=10), args=("x",)
    )
    relative = r"^(\d+ (s|min|h|d) ago|in \d+ (s|min|h|d))$"
    for path, least in ((f"/jobs?q={job_id}", 2), (f"/job?id={job_id}", 4)):
        await load(browser, site + path)
        times = await browser.js(
            "return [...document.querySelectorAll('main .time')].map((n) => "
            "[n.textContent, n.title, getComputedStyle(n).whiteSpace])"
        )
        assert len(times) >= least, (path, times)
        for text, title, white_space in times:
            assert re.match(relative, text), (path, text)
            assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", title), (path, title)
            assert white_space == "nowrap"
        due = "[data-field=due] .time" if "job?" in path else "td:nth-child(8) .time"
        assert await browser.text(due) in ("in 10 min", "in 9 min"), (path, times)
        # No bare ISO time left in the page's text.
        text = await browser.js("return document.getElementById('main').innerText")
        assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text), (path, text)


async def test_the_jobs_table_fits_1400_pixels(browser, site, pool, make_scheduler):
    dashboard_tasks.gate.clear()
    scheduler = await make_scheduler()
    try:
        long_text = "x" * 2000
        failed = await scheduler.schedule(
            dashboard_tasks.boom, execution_time=now(), args=("boom " + "e" * 500,)
        )
        await wait_for_status(pool, failed, "failed")
        wide = await scheduler.schedule(
            dashboard_tasks.echo,
            execution_time=now() + timedelta(hours=1),
            args=(long_text,),
        )
        running = await scheduler.schedule(dashboard_tasks.gated, execution_time=now(), args=(1,))
        await wait_for_status(pool, running, "running")
        await load(browser, site + "/jobs")
        assert await browser.js("return window.innerWidth") <= 1400
        assert await browser.js("return document.documentElement.scrollWidth") <= 1400
        # Status, error and actions in view; the arguments clipped, whole on hover.
        for selector in (
            f"tr[data-job-id='{failed}'] [data-status]",
            f"tr[data-job-id='{failed}'] [data-error-text]",
            f"tr[data-job-id='{failed}'] button[data-action=retry]",
            f"tr[data-job-id='{wide}'] button[data-action=cancel]",
        ):
            right = await browser.js(
                "return document.querySelector(arguments[0]).getBoundingClientRect().right",
                selector,
            )
            assert right <= 1400, selector
        args = await browser.js(
            "const n = document.querySelector(arguments[0]);"
            "return [n.title, n.scrollWidth > n.clientWidth, n.getBoundingClientRect().height];",
            f"tr[data-job-id='{wide}'] [data-args]",
        )
        assert "xxxxxxxxxx" in args[0] and args[1] is True
        error = await browser.text(f"tr[data-job-id='{failed}'] [data-error-text]")
        assert error is not None and "boom" in error
        # One line per row: the row is as tall as a row without long text.
        heights = await browser.js(
            "return [...document.querySelectorAll('table.jobs tbody tr')]"
            ".map((r) => r.getBoundingClientRect().height)"
        )
        assert max(heights) - min(heights) < 2, heights
        await save_shot(browser, "jobs-list")
        # Running only, and back.
        await browser.click("[data-toggle=running]")
        await shows(browser, "[data-toggle=running]", "all statuses")
        await shows(browser, f"tr[data-job-id='{running}'] [data-status]", "running")
        assert await browser.js("return document.querySelectorAll('tr[data-job-id]').length") == 1
        await browser.click("[data-toggle=running]")
        await shows(browser, "[data-toggle=running]", "running only")
        await shows(browser, f"tr[data-job-id='{wide}'] [data-status]", "pending")
    finally:
        dashboard_tasks.gate.set()
    await wait_for_status(pool, running, "completed")


async def test_the_workers_page_lists_each_task_once(browser, site, pool):
    await fake_worker(pool, "dash.echo", "dash.boom", "dash.echo", "dash.echo")
    await load(browser, site + "/workers")
    await shows(browser, "[data-tasks]", "dash.echo, dash.boom")


async def test_the_throughput_chart_has_a_time_axis_and_a_legend(browser, site, pool):
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status, "
        "finished_at) SELECT 'done-' || g, 't', 't', now(), "
        "CASE WHEN g % 4 = 0 THEN 'failed' ELSE 'completed' END, "
        "now() - make_interval(mins => g % 50) FROM generate_series(1, 200) g"
    )
    await load(browser, site + "/")
    labels = await browser.js(
        "return [...document.querySelectorAll('svg.chart [data-axis]')].map((n) => "
        "[n.textContent, n.getAttribute('data-axis')])"
    )
    assert len(labels) == 6, labels
    assert labels[-1][0] == "now"
    assert all(re.match(r"^\d\d:\d\d", text) for text, _ in labels[:-1]), labels
    stamps = [datetime.fromisoformat(iso.replace("Z", "+00:00")) for _, iso in labels]
    assert all(b - a == timedelta(minutes=10) for a, b in itertools.pairwise(stamps))
    legend = await browser.js(
        "return [...document.querySelectorAll('svg.chart [data-legend]')].map((n) => "
        "[n.dataset.legend, n.textContent, getComputedStyle(n.querySelector('rect')).fill])"
    )
    bars = await browser.js(
        "return ['completed', 'failed'].map((k) => getComputedStyle("
        "document.querySelector('svg.chart rect.' + k + ':not([data-legend] rect)')).fill)"
    )
    assert [(k, t) for k, t, _ in legend] == [("completed", "completed"), ("failed", "failed")]
    assert [fill for _, _, fill in legend] == bars
