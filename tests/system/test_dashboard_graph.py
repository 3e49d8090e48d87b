"""The dashboard's workflow pages in a real browser (Debian's chromium through
chromedriver, as tests/system/test_dashboard_browser.py): a graph drawn in
layers and coloured by state, following live events, its nodes linking to
their jobs; cancel a graph and retry a failed job with the token (refused
without it, and in read-only mode); a 500-job graph's first paint; the
workflow list; a failed code-first workflow's retry and fork controls; a
signal sent by hand to a workflow that waits for one.

With PG_SCHEDULER_DASHBOARD_SCREENSHOTS=DIR set, DIR/dashboard-graph.png,
dashboard-graph-500.png, dashboard-workflows.png and dashboard-workflow-failed.png
are saved.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from pg_scheduler import JobSpec, WorkflowContext, chain, group, workflow
from pg_scheduler.dashboard import dashboard_app
from tests.support import workflow_ops_tasks as t
from tests.support.common import job_status, wait_for_status, wait_until
from tests.support.dashboard_support import Browser, browser_missing, chromium, serve

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

TOKEN = "graph-token"
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
# The status colours of style.css.
COLOURS = {
    "completed": "rgb(31, 138, 76)",
    "failed": "rgb(194, 55, 47)",
    "running": "rgb(47, 95, 208)",
    "pending": "rgb(124, 135, 153)",
    "waiting": "rgb(123, 79, 196)",
    "cancelled": "rgb(183, 121, 31)",
}
#: The first paint of a 500-job graph, at most (milliseconds from navigation).
FIRST_PAINT_MS = 1000


@pytest.fixture(autouse=True)
def fresh() -> None:
    t.reset()


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


def now() -> datetime:
    return datetime.now(UTC)


def spec(name: str, fn=t.node) -> JobSpec:
    return JobSpec(fn, now(), (name,))


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


async def node_status(browser: Browser, job_id: str) -> str | None:
    return await browser.js(
        "const n = document.querySelector(`a[data-node='${arguments[0]}']`);"
        "return n ? n.getAttribute('data-status') : null;",
        job_id,
    )


async def node_shows(browser: Browser, job_id: str, status: str, timeout: float = 20) -> None:
    async def matches() -> bool:
        return await node_status(browser, job_id) == status

    await wait_until(matches, timeout=timeout, message=f"node {job_id} to show {status}")


async def colours(browser: Browser) -> dict[str, tuple[str, str, str]]:
    """job id -> (status, the node's colour, its bar's fill)."""
    rows = await browser.js(
        "return [...document.querySelectorAll('svg.graph a[data-node]')].map((n) => ["
        "n.getAttribute('data-node'), n.getAttribute('data-status'), getComputedStyle(n).color,"
        "getComputedStyle(n.querySelector('rect.stripe')).fill])"
    )
    return {job_id: (status, colour, fill) for job_id, status, colour, fill in rows}


async def boxes(browser: Browser) -> dict[str, list[float]]:
    """job id -> its node's (left, top) on the page."""
    rows = await browser.js(
        "return [...document.querySelectorAll('svg.graph a[data-node]')].map((n) => {"
        "const r = n.querySelector('rect.box').getBoundingClientRect();"
        "return [n.getAttribute('data-node'), [r.left, r.top]]; })"
    )
    return dict(rows)


async def real_click(browser: Browser, selector: str) -> None:
    """A click as a user makes it (WebDriver's element click: scrolled into view)."""
    found = await browser.command("POST", "/element", {"using": "css selector", "value": selector})
    element = next(iter(found.values()))
    await browser.command("POST", f"/element/{element}/click", {})


async def set_token(browser: Browser, token: str) -> None:
    await browser.js("sessionStorage.setItem('pg_scheduler_token', arguments[0])", token)


async def save_shot(browser: Browser, name: str) -> None:
    shots = os.environ.get("PG_SCHEDULER_DASHBOARD_SCREENSHOTS")
    if shots:
        await asyncio.to_thread(Path(shots).mkdir, parents=True, exist_ok=True)
        await browser.screenshot(Path(shots) / f"dashboard-{name}.png")


async def statuses(pool: asyncpg.Pool, ids: list[str]) -> list[str | None]:
    return [await job_status(pool, i) for i in ids]


async def settled(pool: asyncpg.Pool, ids: list[str]) -> list[str | None]:
    async def done() -> bool:
        return all(s not in ("pending", "running", "waiting") for s in await statuses(pool, ids))

    await wait_until(done, message=f"jobs {ids} to end")
    return await statuses(pool, ids)


async def test_a_graph_is_drawn_in_layers_coloured_by_state_and_follows_live_events(
    browser, site, pool, make_scheduler
):
    scheduler = await make_scheduler()
    flow = chain(
        spec("start"), spec("held", t.held), group(spec("left"), spec("right")), spec("end")
    )
    ids = await scheduler.schedule_bulk(flow)
    await wait_for_status(pool, ids[0], "completed")
    await wait_for_status(pool, ids[1], "running")
    await load(browser, f"{site}/graph?id={ids[4]}")
    await shows(browser, "#live", "live")
    assert (
        await browser.js("return document.querySelectorAll('svg.graph a[data-node]').length") == 5
    )
    edges = await browser.js(
        "return [...document.querySelectorAll('svg.graph path.edge')]"
        ".map((e) => [e.getAttribute('data-from'), e.getAttribute('data-to')])"
    )
    assert sorted(map(tuple, edges)) == sorted(
        [(ids[0], ids[1]), (ids[1], ids[2]), (ids[1], ids[3]), (ids[2], ids[4]), (ids[3], ids[4])]
    )
    # Coloured by state: the status colours of the rest of the dashboard.
    shown = await colours(browser)
    expected = ["completed", "running", "waiting", "waiting", "waiting"]
    assert [shown[i][0] for i in ids] == expected
    for job_id, status in zip(ids, expected, strict=True):
        assert shown[job_id][1:] == (COLOURS[status], COLOURS[status]), (job_id, shown[job_id])
    # Layers left to right (each job one past its deepest dependency); a layer's
    # jobs one above the other.
    at = await boxes(browser)
    assert at[ids[0]][0] < at[ids[1]][0] < at[ids[2]][0] == at[ids[3]][0] < at[ids[4]][0]
    assert at[ids[2]][1] != at[ids[3]][1]
    await shows(browser, "[data-graph-count=running]", "running 1")
    await shows(browser, "[data-graph-count=waiting]", "waiting 3")
    await shows(browser, "[data-graph-count=completed]", "completed 1")
    assert await browser.text("a[data-node] text.task") == "wfops.node"
    # The job the page was opened on stands out.
    assert "focus" in await browser.js(
        "return document.querySelector(`a[data-node='${arguments[0]}']`).getAttribute('class')",
        ids[4],
    )
    await save_shot(browser, "graph")
    drawn = await browser.js("return document.querySelector('svg.graph')")
    # No reload: the page follows the events (it polls only every 30 s here),
    # and redraws in place while the graph keeps its shape.
    t.release.set()
    for job_id in ids:
        await node_shows(browser, job_id, "completed")
    await shows(browser, "[data-graph-count=completed]", "completed 5")
    assert await browser.text("[data-graph-count=running]") == "running 0"
    assert await browser.js("return document.querySelector('svg.graph') === arguments[0]", drawn)
    assert (await colours(browser))[ids[1]][1] == COLOURS["completed"]
    assert await browser.text("button[data-action=cancel_workflow]") is None  # nothing to cancel


async def test_a_burst_of_events_refreshes_the_graph_a_few_times_a_second(
    browser, site, pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    later = now() + timedelta(hours=1)
    members = [JobSpec(t.node, later, (f"m{i}",)) for i in range(300)]
    ids = await scheduler.schedule_bulk(chain(group(*members), JobSpec(t.node, later, ("join",))))
    await load(browser, f"{site}/graph?id={ids[0]}")
    await shows(browser, "#live", "live")
    loaded = await browser.js("return performance.now()")
    # One event after another, as fast as they go: a second or so of them.
    began = time.monotonic()
    for job_id in ids[:-1]:
        assert await scheduler.cancel_job(job_id)
    took = time.monotonic() - began
    await shows(browser, "[data-graph-count=cancelled]", "cancelled 301")
    starts = await browser.js(
        "return performance.getEntriesByType('resource').filter((r) =>"
        " r.name.includes('/api/graph') && r.startTime > arguments[0]).map((r) => r.startTime)",
        loaded,
    )
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Throttled: 400 ms between re-reads (less a timer's slack), however many events.
    assert all(gap >= 350 for gap in gaps), gaps
    print(f"{len(ids) - 1} cancels in {took:.2f} s: {len(starts)} re-reads, gaps", gaps)


async def test_only_events_naming_a_job_of_the_graph_refresh_it(
    browser, site, pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    ids = await scheduler.schedule_bulk(chain(spec("a"), spec("b")))
    await load(browser, f"{site}/graph?id={ids[0]}")
    concerns = await browser.js(
        "return [CHANGE.graph({jobs: ['elsewhere'], kinds: {}}),"
        " CHANGE.graph({jobs: ['elsewhere', arguments[0]], kinds: {}}),"
        " CHANGE.graph({jobs: [], kinds: {}, more: true})]",
        ids[1],
    )
    assert concerns == [False, True, True]


async def test_a_node_links_to_its_job_and_a_job_of_a_graph_back_to_it(
    browser, site, pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    ids = await scheduler.schedule_bulk(chain(spec("one"), spec("two")))
    alone = await scheduler.schedule(t.node, args=("alone",))
    await load(browser, f"{site}/graph?id={ids[0]}")
    await real_click(browser, f"a[data-node='{ids[1]}']")
    await wait_until(
        lambda: browser.js("return location.pathname === '/job'"), message="the job page"
    )
    await load(browser, f"{site}/job?id={ids[1]}")
    await shows(browser, "[data-field=id]", ids[1])
    await shows(browser, "[data-field=graph] a", "view its graph")
    await browser.click("[data-field=graph] a")
    await wait_until(
        lambda: browser.js("return location.pathname === '/graph'"), message="the graph page"
    )
    await load(browser, f"{site}/graph?id={ids[1]}")
    assert await node_status(browser, ids[0]) == "pending"
    await load(browser, f"{site}/job?id={alone}")
    assert await browser.text("[data-field=graph]") is None


async def test_cancel_a_graph_and_retry_its_failed_job_with_the_token(
    browser, site, pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    ids = await scheduler.schedule_bulk(
        chain(spec("start"), spec("bad"), group(spec("x"), spec("y")))
    )
    assert await settled(pool, ids) == ["completed", "failed", "cancelled", "cancelled"]
    # The failed job's own page offers the same retry.
    await load(browser, f"{site}/job?id={ids[1]}")
    await shows(browser, "button[data-action=retry_workflow]", "retry with its graph")
    await load(browser, f"{site}/job?id={ids[0]}")
    assert await browser.text("button[data-action=retry_workflow]") is None
    await load(browser, f"{site}/graph?id={ids[0]}")
    await shows(browser, "[data-section=graph-failures]", "Ended without completing (3)")
    # Retry only where the server would: the failed job, not its cancelled dependents.
    buttons = await browser.js(
        "return [...document.querySelectorAll('tr[data-failed-node] button')]"
        ".map((b) => [b.closest('tr').dataset.failedNode, b.dataset.action])"
    )
    assert buttons == [[ids[1], "retry_workflow"]]
    # A wrong token: refused, said so, nothing written.
    await set_token(browser, "not-the-token")
    await browser.click(f"tr[data-failed-node='{ids[1]}'] button[data-action=retry_workflow]")

    async def refused() -> bool:
        return "token is required" in (await browser.text("#toast") or "")

    await wait_until(refused, message="the refusal to show")
    assert await statuses(pool, ids) == ["completed", "failed", "cancelled", "cancelled"]
    t.failing.clear()
    await set_token(browser, TOKEN)
    await browser.click(f"tr[data-failed-node='{ids[1]}'] button[data-action=retry_workflow]")
    for job_id in ids:
        await node_shows(browser, job_id, "completed")
    assert await settled(pool, ids) == ["completed"] * 4
    assert await browser.text("[data-section=graph-failures]") is None
    assert t.runs == {"start": 1, "bad": 2, "x": 1, "y": 1}

    # Cancel a running graph from its page.
    held = await scheduler.schedule_bulk(chain(spec("held", t.held), spec("after")))
    await wait_for_status(pool, held[0], "running")
    await load(browser, f"{site}/graph?id={held[1]}")
    await shows(browser, "button[data-action=cancel_workflow]", "cancel graph (2 unfinished)")
    await browser.click("button[data-action=cancel_workflow]")
    await node_shows(browser, held[0], "cancelled")
    await node_shows(browser, held[1], "cancelled")
    assert await settled(pool, held) == ["cancelled", "cancelled"]
    assert await browser.text("button[data-action=cancel_workflow]") is None
    assert t.runs["after"] == 0


async def test_read_only_the_graph_buttons_are_disabled_and_the_server_refuses(
    browser, readonly_site, pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    ids = await scheduler.schedule_bulk(chain(spec("bad"), spec("then")))
    assert await settled(pool, ids) == ["failed", "cancelled"]
    held = await scheduler.schedule_bulk(chain(spec("held", t.held), spec("after")))
    await wait_for_status(pool, held[0], "running")
    for graph_id, action in ((ids[0], "retry_workflow"), (held[0], "cancel_workflow")):
        await load(browser, f"{readonly_site}/graph?id={graph_id}")
        assert await browser.text("#mode") == "read-only"
        buttons = await browser.js(
            "return [...document.querySelectorAll('main button[data-action]')]"
            ".map((b) => [b.dataset.action, b.disabled, b.title])"
        )
        assert [b[0] for b in buttons] == [action]
        assert all(disabled and "read-only" in title for _, disabled, title in buttons)
        await browser.click(f"button[data-action={action}]")  # does nothing
        response = await browser.js(
            "const x = new XMLHttpRequest(); x.open('POST', '/api/action/' + arguments[0], false);"
            "x.setRequestHeader('Content-Type', 'application/json');"
            "x.setRequestHeader('X-Dashboard-Token', 'anything');"
            "x.send(JSON.stringify({job_id: arguments[1]})); return [x.status, x.responseText];",
            action,
            graph_id,
        )
        assert response[0] == 403 and "read-only" in response[1]
    assert await statuses(pool, ids) == ["failed", "cancelled"]
    assert await statuses(pool, held) == ["running", "waiting"]
    t.release.set()
    assert await settled(pool, held) == ["completed", "completed"]


async def test_markup_in_a_graph_is_shown_as_text(browser, site, pool):
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                    error_message, has_dependents, finished_at)
        VALUES ('evil-1', $1, $1, now(), 'failed', $1, true, now()),
               ('evil-2', 't', 't', now(), 'cancelled', NULL, false, now())
        """,
        EVIL,
    )
    await pool.execute(
        "INSERT INTO job_dependencies (job_id, depends_on, ordinal) VALUES ('evil-2', 'evil-1', 0)"
    )
    for path in ("/graph?id=evil-2", "/workflows"):
        await load(browser, site + path)
        assert await browser.js("return window.__pwned === undefined") is True, path
        assert (
            await browser.js("return document.querySelectorAll('main script, main img').length")
            == 0
        ), path
    await load(browser, site + "/graph?id=evil-2")
    title = await browser.js(
        "return document.querySelector(\"a[data-node='evil-1'] title\").textContent"
    )
    assert EVIL in title
    error = await browser.text("tr[data-failed-node='evil-1'] td.result")
    assert error == EVIL


async def big_graph(pool: asyncpg.Pool, size: int, width: int) -> None:
    """``size`` jobs in layers of ``width``, each after two of the layer before;
    every status among them."""
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                    has_dependents, created_at)
        SELECT 'big-' || lpad(g::text, 4, '0'), 'big', 'big.layer-' || (g / $2),
               now() + interval '1 hour',
               (ARRAY['completed', 'running', 'waiting', 'pending', 'failed', 'cancelled'])
                   [1 + g % 6],
               g < $1 - $2, now() + make_interval(secs => g / 1000.0)
          FROM generate_series(0, $1 - 1) g
        """,
        size,
        width,
    )
    await pool.execute(
        """
        INSERT INTO job_dependencies (job_id, depends_on, ordinal)
        SELECT 'big-' || lpad(g::text, 4, '0'), 'big-' || lpad((g - $2)::text, 4, '0'), 0
          FROM generate_series($2, $1 - 1) g
        UNION ALL
        SELECT 'big-' || lpad(g::text, 4, '0'),
               'big-' || lpad(((g / $2 - 1) * $2 + (g + 7) % $2)::text, 4, '0'), 1
          FROM generate_series($2, $1 - 1) g WHERE (g + 7) % $2 <> g % $2
        """,
        size,
        width,
    )


async def test_a_500_job_graph_paints_within_a_second(browser, site, pool):
    await big_graph(pool, 500, 25)
    edges = await pool.fetchval("SELECT count(*) FROM job_dependencies")
    await load(browser, site + "/")  # a browser already open, as a user's is
    figures: list[list[float]] = []
    for _ in range(3):
        await browser.open(f"{site}/graph?id=big-0250")

        async def complete() -> bool:
            return bool(
                await browser.js("return performance.getEntriesByName('graph-complete').length")
            )

        await wait_until(complete, timeout=20, message="the whole graph")
        # Milliseconds from the navigation: the data in, the first paint (the
        # part in view), the whole drawing in the page.
        marks = await browser.js(
            "return [performance.getEntriesByType('resource').find("
            "(r) => r.name.includes('/api/graph')).responseEnd,"
            " ...['graph-painted', 'graph-complete'].map("
            "(n) => performance.getEntriesByName(n)[0].startTime)]"
        )
        figures.append(marks)
        assert await browser.js("return document.querySelectorAll('a[data-node]').length") == 500
        assert await browser.js("return document.querySelectorAll('path.edge').length") == edges
        assert marks[1] < FIRST_PAINT_MS, f"first paint: {marks} ms"
        # The job the page is for is in view.
        assert await browser.js(
            "const box = document.querySelector('.graph-box').getBoundingClientRect();"
            "const r = document.querySelector(\"a[data-node='big-0250'] rect.box\")"
            ".getBoundingClientRect();"
            "return r.left >= box.left && r.right <= box.right && r.top >= box.top"
            " && r.bottom <= box.bottom;"
        )
    # Every edge runs left to right: each job in a layer past its dependencies'.
    backwards = await browser.js(
        "const at = (id) => document.querySelector(`a[data-node='${id}'] rect.box`)"
        ".getBoundingClientRect().left;"
        "return [...document.querySelectorAll('path.edge')].filter((e) =>"
        " at(e.getAttribute('data-from')) >= at(e.getAttribute('data-to'))).length"
    )
    assert backwards == 0
    layers = await browser.js(
        "return new Set([...document.querySelectorAll('a[data-node] rect.box')]"
        ".map((r) => r.getBoundingClientRect().left)).size"
    )
    assert layers == 20
    # The failures table lists the oldest 50 of the 166 that ended badly.
    assert await browser.js("return document.querySelectorAll('tr[data-failed-node]').length") == 50
    assert await browser.text("[data-failures-more]") is not None
    print("500-job graph (data, first paint, complete) ms:", figures)
    await save_shot(browser, "graph-500")


async def test_the_workflows_page_lists_graphs_and_workflows(browser, site, pool, make_scheduler):
    scheduler = await make_scheduler()
    t.failing.add("charge")
    ids = await scheduler.schedule_bulk(chain(spec("one"), spec("two")))
    workflow_id = await scheduler.schedule(t.staged, args=(1,))
    assert await settled(pool, [*ids, workflow_id]) == ["completed", "completed", "failed"]
    await load(browser, site + "/workflows")
    assert await browser.js("return document.querySelector('nav a.current').dataset.nav") == (
        "workflows"
    )
    rows = await browser.js(
        "return [...document.querySelectorAll('tr[data-workflow]')]"
        ".map((r) => [r.dataset.workflow, r.dataset.kind])"
    )
    assert rows == [[workflow_id, "workflow"], [ids[0], "graph"]]
    await shows(browser, f"tr[data-workflow='{workflow_id}'] [data-status]", "failed")
    await save_shot(browser, "workflows")
    # It re-reads on events naming one of its rows' jobs, or a new job.
    concerns = await browser.js(
        "return [CHANGE.workflows({jobs: ['elsewhere'], kinds: {completed: 1}}),"
        " CHANGE.workflows({jobs: [arguments[0]], kinds: {completed: 1}}),"
        " CHANGE.workflows({jobs: ['new'], kinds: {scheduled: 1}})]",
        ids[0],
    )
    assert concerns == [False, True, True]
    await load(browser, site + "/workflows?status=failed")
    rows = await browser.js("return [...document.querySelectorAll('tr[data-workflow]')].length")
    assert rows == 1
    await load(browser, site + "/workflows")
    await browser.click(f"tr[data-workflow='{ids[0]}'] a[href*='/graph']")
    await wait_until(
        lambda: browser.js("return location.pathname === '/graph'"), message="the graph page"
    )
    await load(browser, f"{site}/graph?id={ids[0]}")
    assert await browser.js("return document.querySelector('nav a.current').dataset.nav") == (
        "workflows"
    )


async def test_a_failed_workflow_retries_from_its_failed_step_or_forks(
    browser, site, readonly_site, pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.add("charge")
    job_id = await scheduler.schedule(t.staged, args=(1,))
    assert await settled(pool, [job_id]) == ["failed"]
    # Read-only: the controls are there, disabled.
    await load(browser, f"{readonly_site}/job?id={job_id}")
    disabled = await browser.js(
        "return [...document.querySelectorAll('[data-section=workflow-actions] button,"
        " [data-fork-step]')].map((b) => b.disabled)"
    )
    assert disabled == [True, True, True]

    await load(browser, f"{site}/job?id={job_id}")
    await set_token(browser, TOKEN)
    await shows(browser, "button[data-action=retry_workflow]", "retry from failed step 2")
    await save_shot(browser, "workflow-failed")
    assert await browser.js("return document.querySelector('[data-fork-step]').value") == "2"
    t.failing.clear()
    # A fork from step 1: a new job, and the page goes to it.
    await browser.js(
        "const s = document.querySelector('[data-fork-step]'); s.value = '1';"
        "s.dispatchEvent(new Event('change'));"
    )
    await browser.click("button[data-action=fork_workflow]")

    async def moved() -> bool:
        return bool(
            await browser.js(
                "return new URLSearchParams(location.search).get('id') !== arguments[0]", job_id
            )
        )

    await wait_until(moved, message="the page of the fork")
    fork_id = await browser.js("return new URLSearchParams(location.search).get('id')")
    assert await scheduler.result(fork_id, timeout=10) == 3
    # Then the retry of the original, from its failed step.
    await load(browser, f"{site}/job?id={job_id}")
    await browser.click("button[data-action=retry_workflow]")
    await wait_for_status(pool, job_id, "completed")
    assert await scheduler.result(job_id) == 3
    await shows(browser, "[data-field=status]", "completed")
    assert t.runs == {"reserve": 2, "charge": 3, "ship": 2}
    # A completed workflow may be forked, not retried.
    assert await browser.text("button[data-action=retry_workflow]") is None
    assert await browser.text("button[data-action=fork_workflow]") == "fork"


@workflow(name="dash_browser.approval")
async def approval(ctx: WorkflowContext) -> object:
    return await ctx.wait_for_signal("approved")


async def test_a_waiting_workflow_is_signalled_by_hand(
    browser, site, readonly_site, pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval)
    await wait_for_status(pool, job_id, "waiting")
    await scheduler.signal(job_id, "note", 1, idempotency_key="note-7")  # unread, with its key
    # Read-only: the form is there, disabled.
    await load(browser, f"{readonly_site}/job?id={job_id}")
    disabled = await browser.js(
        "return [...document.querySelectorAll('[data-section=signal-actions] input,"
        " [data-section=signal-actions] button')].map((b) => b.disabled)"
    )
    assert disabled == [True, True, True, True]

    await load(browser, f"{site}/job?id={job_id}")
    await set_token(browser, TOKEN)
    assert await browser.js("return document.querySelector('[data-signal-name]').value") == (
        "approved"
    )
    assert await browser.text("tr[data-signal=note] [data-signal-idempotency]") == "note-7"
    # A payload that is not JSON is refused in the page: nothing sent.
    await browser.js("document.querySelector('[data-signal-payload]').value = '{oops'")
    await browser.click("button[data-action=signal_workflow]")
    await shows(
        browser,
        "#toast",
        "payload is not JSON: "
        + await browser.js("try { JSON.parse('{oops') } catch (e) { return e.message }"),
    )
    assert await pool.fetchval("SELECT count(*) FROM workflow_signals") == 1
    await browser.js(
        "document.querySelector('[data-signal-payload]').value = '{\"by\": \"ops\"}';"
        "document.querySelector('[data-signal-key]').value = 'desk-1';"
    )
    await browser.click("button[data-action=signal_workflow]")
    assert await scheduler.result(job_id, timeout=10) == {"by": "ops"}
    await shows(browser, "[data-field=status]", "completed")
    assert await browser.text("[data-section=signal-actions]") is None
    assert (
        await pool.fetchval(
            "SELECT idempotency_key FROM workflow_signals WHERE job_id = $1 AND name = 'approved'",
            job_id,
        )
        == "desk-1"
    )


async def test_without_events_the_graph_page_polls(browser, pool, make_scheduler):
    app = dashboard_app(pool, pgbouncer=True, poll_seconds=0.5)  # no LISTEN: polling only
    scheduler = await make_scheduler(start=False)
    ids = await scheduler.schedule_bulk(chain(spec("a"), spec("b")))
    try:
        async with serve(app) as url:
            await load(browser, f"{url}/graph?id={ids[0]}")
            await shows(browser, "#live", "polling")
            assert await node_status(browser, ids[0]) == "pending"
            await pool.execute(
                "UPDATE scheduled_jobs SET status = 'failed', finished_at = now() "
                "WHERE job_id = $1",
                ids[0],
            )
            await node_shows(browser, ids[0], "failed")
    finally:
        await app.state.dashboard.close()
