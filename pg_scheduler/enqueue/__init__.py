"""How a job gets in: the one producer (``producer``: ``Producer`` builds checked
rows, ``Enqueuer`` writes them through asyncpg; ``dbapi.DbapiEnqueuer`` through
a caller's psycopg connection), the one declaration of a job's keywords, their
defaults and checks (``fields.JobOptions``, ``fields.check_job``; each field's
check in ``checks``), ``schedule_bulk``'s rows (``rows``), dedupe keys
(``dedupe``) and keyed writes (``keyed``), ids (``ids``) and conflict policies
(``conflicts``). It never imports the engine or the Scheduler."""
