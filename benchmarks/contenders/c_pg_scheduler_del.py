"""This repository's pg_scheduler configured for throughput as the README
recommends: completed rows deleted at once (``VacuumPolicy(IMMEDIATE)``)."""

from __future__ import annotations

import os

os.environ["PGS_BENCH_DELETE_COMPLETED"] = "1"

from c_pg_scheduler import Contender as _Base


class Contender(_Base):
    version = _Base.version + " [completed rows deleted]"
