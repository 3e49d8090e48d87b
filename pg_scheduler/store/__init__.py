"""Every SQL statement the scheduler runs, by table or concern, one method per operation.

``names``: schema, channels, qualification. ``jobs``: the ``scheduled_jobs``
statements (insert, claim, complete, retry, fail, release, cancel). ``workers``:
heartbeats, leases, rescue. ``periodic``: ``periodic_jobs``. ``housekeeping``:
vacuum, statistics, operator listings. ``queues``: the claim's skip
scan over queues, pause/resume/list. ``schema``: migration bookkeeping.
``session``: statements about a connection itself.
"""

from .jobs import Completion, HandOffRoom, NewJob, Store
from .names import (
    CANCEL_CHANNEL,
    DEFAULT_SCHEMA,
    JOBS_CHANNEL,
    QUEUES_CHANNEL,
    Executor,
    Qualifier,
    channel_name,
    check_schema,
    lock_key_for,
    quote_ident,
)
from .queues import QueueStore

__all__ = [
    "CANCEL_CHANNEL",
    "DEFAULT_SCHEMA",
    "JOBS_CHANNEL",
    "QUEUES_CHANNEL",
    "Completion",
    "Executor",
    "HandOffRoom",
    "NewJob",
    "Qualifier",
    "QueueStore",
    "Store",
    "channel_name",
    "check_schema",
    "lock_key_for",
    "quote_ident",
]
