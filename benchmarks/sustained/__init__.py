"""Sustained load: ``python -m benchmarks.sustained run [options]``.

Each contender in turn, on one PostgreSQL server (the embedded one in a
temporary directory unless ``--dsn``), in a fresh database: a producer
process offers jobs at a fixed rate (or keeps the queue ``--depth-target``
deep), two worker processes run them (each job awaits
``asyncio.sleep(0.001)``; 256-byte payloads), through the phases warm-up,
clean, idle-in-transaction, readers, rate x1.5, PostgreSQL restart, kill,
recovery. The orchestrator samples latency, rates, queue depth, the
contender's tables and the oldest transaction every ``--sample-seconds``,
and checks at the end that every produced job ran. ``docs/benchmarks.md``
("Sustained load") describes the phases, the figures and the targets.

Adding a contender
------------------
Write ``benchmarks/sustained/contenders/<name>.py`` with one class,
``Contender``; ``--contenders <name>`` then runs it. It runs in this
repository's interpreter (asyncpg is there), unless ``harness.REQUIREMENTS``
names a pip requirement for it (then in its own virtualenv under
``benchmarks/.venvs/``, as the peers). The class:

``Contender(dsn: str, options: dict)``
    ``options`` are the ``--options`` JSON's entry for this contender (worker settings).
``version: str``
    what runs (library and version), for the summary.
``job_table: str``
    the table of jobs: the readers phase loops ``SELECT count(*)`` on it, and
    its dead tuples are the plotted ones.
``depth_sql: str``
    one value: jobs enqueued and due, not yet taken by a worker.
``relations: list[str] | None``
    the tables to sample (with their indexes); None: every table of the database.
``async install() -> None``
    create the schema (once, in a process of its own, before anything else).
``async open_producer() -> None`` and ``async enqueue(payloads: list[str]) -> None``
    the producer: one enqueue call per batch of due jobs (the payloads are
    opaque 256-character strings; hand each back to the handler unchanged).
    A call that raises is retried with the same payloads.
``async run_worker(handler) -> None``
    run one worker until cancelled (SIGTERM cancels it; clean up in
    ``finally``); for each job, ``await handler(payload)``. Returning or
    raising by itself counts as the worker giving up: the process exits, the
    harness records it and starts a replacement.
``async close() -> None``
    release what ``open_producer`` opened.

A raw-SQL table layout needs only asyncpg: its ``install`` creates the table,
``enqueue`` inserts, ``run_worker`` claims (e.g. ``FOR UPDATE SKIP LOCKED``),
calls the handler and acknowledges.
"""
