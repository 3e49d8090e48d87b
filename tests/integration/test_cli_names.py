"""Operators' typos are caught: pausing or limiting a queue or task the
database has never heard of is refused unless --force, and phantom queues
and limits have a delete command."""

from __future__ import annotations

from datetime import timedelta

from tests.integration.test_cli_ops import _keep_test_logging, add_job, cli  # noqa: F401


async def stored_queues(pool) -> dict[str, bool]:
    return {r["name"]: r["paused"] for r in await pool.fetch("SELECT * FROM scheduler_queues")}


async def test_pausing_an_unknown_queue_is_refused_unless_forced(pool, dsn):
    refused = await cli(dsn, "queues", "pause", "nosuchqueue")
    assert refused.code == 2
    assert "no queue named 'nosuchqueue' is known" in refused.err and "--force" in refused.err
    assert await stored_queues(pool) == {}
    assert (await cli(dsn, "queues", "resume", "nosuchqueue")).code == 2
    # The default queue, and a queue a job has been in, are known.
    assert (await cli(dsn, "queues", "pause", "default")).code == 0
    await add_job(pool, "completed", task="app:mail")
    await pool.execute("UPDATE scheduled_jobs SET queue = 'emails'")
    assert (await cli(dsn, "queues", "pause", "emails")).code == 0
    forced = await cli(dsn, "queues", "pause", "later", "--force")
    assert forced.code == 0, forced.err
    assert await stored_queues(pool) == {"default": True, "emails": True, "later": True}


async def test_queues_delete_drops_a_phantom_and_keeps_one_with_jobs(pool, dsn):
    assert (await cli(dsn, "queues", "pause", "phantom", "--force")).code == 0
    deleted = await cli(dsn, "queues", "delete", "phantom")
    assert deleted.code == 0, deleted.err
    assert deleted.out.strip() == "deleted queue phantom (it was paused: resumed)"
    assert "phantom" not in (await cli(dsn, "queues", "list")).out
    again = await cli(dsn, "queues", "delete", "phantom")
    assert again.code == 1 and "no stored queue named 'phantom'" in again.err

    await add_job(pool, "pending", task="app:mail", due=timedelta(hours=1))
    await pool.execute("UPDATE scheduled_jobs SET queue = 'busy'")
    assert (await cli(dsn, "queues", "pause", "busy")).code == 0
    kept = await cli(dsn, "queues", "delete", "busy")
    assert kept.code == 1 and "1 pending" in kept.err and "resume it instead" in kept.err
    assert await stored_queues(pool) == {"busy": True}
    forced = await cli(dsn, "queues", "delete", "busy", "--force", "--json")
    assert forced.code == 0 and forced.json() == {
        "queue": "busy",
        "deleted": True,
        "was_paused": True,
    }
    assert await stored_queues(pool) == {}


async def test_limits_on_an_unknown_task_are_refused_unless_forced(pool, dsn):
    refused = await cli(dsn, "limits", "set", "task", "typo.task", "--max-running", "2")
    assert refused.code == 2
    assert "no task named 'typo.task' is known" in refused.err and "--force" in refused.err
    assert await pool.fetchval("SELECT count(*) FROM scheduler_limits") == 0
    queue = await cli(dsn, "limits", "set", "queue", "typo-queue", "--max-running", "2")
    assert queue.code == 2 and "no queue named 'typo-queue'" in queue.err
    # A task a job carries (or a live worker lists) is known.
    await add_job(pool, "pending", task="app:mail", due=timedelta(hours=1))
    known = await cli(dsn, "limits", "set", "task", "app:mail", "--max-running", "2")
    assert known.code == 0, known.err
    await pool.execute(
        "INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks)"
        " VALUES ('w1', 'h', 1, 1, ARRAY['listed.task'])"
    )
    listed = await cli(dsn, "limits", "set", "task", "listed.task", "--rate-limit", "5/s")
    assert listed.code == 0, listed.err
    forced = await cli(dsn, "limits", "set", "task", "typo.task", "--max-running", "2", "--force")
    assert forced.code == 0, forced.err


async def test_limits_delete_and_unset_remove_a_limit(pool, dsn):
    for name in ("a.task", "b.task"):
        assert (
            await cli(dsn, "limits", "set", "task", name, "--max-running", "1", "--force")
        ).code == 0
    assert (await cli(dsn, "limits", "delete", "task", "a.task")).code == 0
    assert (await cli(dsn, "limits", "unset", "task", "b.task")).code == 0
    assert await pool.fetchval("SELECT count(*) FROM scheduler_limits") == 0
    gone = await cli(dsn, "limits", "delete", "task", "a.task")
    assert gone.code == 1 and "no limit on task 'a.task'" in gone.err
