"""This repository's pg_scheduler with ``Scheduler(gc_freeze=False)``: Python's
garbage collector left as it is, so full collections walk every object alive
at start() (see pg_scheduler.support.process_gc). Measured in the latency scenarios
only; elsewhere it is the same as ``pg_scheduler``."""

from __future__ import annotations

import os

os.environ["PGS_BENCH_NO_GC_FREEZE"] = "1"

from c_pg_scheduler import Contender as _Base


class Contender(_Base):
    version = _Base.version + " [gc_freeze=False]"
