"""``pg-scheduler worker tests.support.process_tasks:SETTINGS``, started as a script
(``python -m tests.support.process_worker`` from the repository root).

Run as the main module, this file is also imported (as ``__mp_main__``) by every job
process the worker spawns, before the job's arguments reach it: the way a
heavy main script slows each process start. With
``PROCESS_TASKS_START_GATE=<path>`` set, that import waits until the file
exists, so a test holds every process start for as long as it likes.
"""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__mp_main__":
    gate = os.environ.get("PROCESS_TASKS_START_GATE")
    if gate:
        deadline = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
elif __name__ == "__main__":
    from pg_scheduler.cli import main

    sys.exit(main(["--log-level", "warning", "worker", "tests.support.process_tasks:SETTINGS"]))
