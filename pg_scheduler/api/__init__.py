"""What :class:`~pg_scheduler.Scheduler` offers, grouped: ``jobs`` (tasks, schedule,
read and cancel a job), ``ops`` (the operator's methods), ``limits`` (global limits),
``queues``, ``results`` (awaiting jobs, events), ``compat`` (the 0.2.x pass-through
methods) and ``args`` (the constructor's checks). Mixins of the Scheduler; no SQL here."""
