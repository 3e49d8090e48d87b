"""How a job gets in: the one producer (``producer.Enqueuer``), one job's fields
(``fields``) and their checks (``checks``), ``schedule_bulk``'s rows (``rows``),
dedupe keys (``dedupe``) and keyed writes (``keyed``), ids (``ids``) and conflict
policies (``conflicts``)."""
