"""This repository's pg_scheduler with the in-process start turned off
(``start_due_jobs_locally=False``): every job reaches the worker through
NOTIFY and a claim, as when the producer runs in another process. Measured in
the latency scenario only; elsewhere it is the same as ``pg_scheduler``."""

from __future__ import annotations

import os

os.environ["PGS_BENCH_NO_LOCAL_START"] = "1"

from c_pg_scheduler import Contender as _Base


class Contender(_Base):
    version = _Base.version + " [no in-process start: NOTIFY + claim]"
