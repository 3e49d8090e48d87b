"""What :class:`~pg_scheduler.Scheduler` offers, as parts it holds (no SQL here):
``settings`` (its settings and timings, one object the parts share), ``args``
(the constructor's checks, which make the settings), ``wiring`` (the parts,
built from the settings), ``lifecycle`` (start and shutdown), ``ops`` (schema,
grants, rescue, vacuum, statistics), ``limits`` (global limits), ``queues``,
``results`` (awaiting jobs, events), ``compat`` (the 0.2.x pass-through methods
with logic of their own), and ``jobs`` (schedule, read and cancel a job). Each
part receives what it needs, never the Scheduler."""
