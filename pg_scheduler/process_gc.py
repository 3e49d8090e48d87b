"""``Scheduler(gc_freeze=True)``: keep Python's full garbage collections short
while a scheduler runs.

A full (generation 2) collection walks every tracked object of the process
and pauses the event loop meanwhile: on the benchmark machine 8-14 ms for the
~42,000 objects that importing pg_scheduler, asyncpg and pydantic leaves
behind, more in a real application. Under a drain one runs about once a
second, and every job that should start during it waits. ``gc.freeze()``
moves the objects alive at ``start()`` (modules, classes, the application's
long-lived state) out of those walks, so a full collection then costs about
a millisecond.

Process-wide, hence opt-in for the library (the ``pg-scheduler worker``
command turns it on, since it owns its process): objects frozen here that
later become unreachable in a reference cycle are not reclaimed while any
scheduler with ``gc_freeze=True`` runs. The last one to shut down unfreezes
them, and the next full collection reclaims what is garbage by then, unless
the application had frozen objects itself before (a pre-fork server does):
then its freeze is left as it was.
"""

from __future__ import annotations

import gc

_holders = 0
_frozen_by_application = False


def freeze_objects() -> None:
    """Freeze what is alive now; counted, so several schedulers pair up."""
    global _holders, _frozen_by_application
    if _holders == 0:
        _frozen_by_application = gc.get_freeze_count() > 0
    _holders += 1
    gc.freeze()


def thaw_objects() -> None:
    """Undo one :func:`freeze_objects`; the last one unfreezes (see the module docstring)."""
    global _holders
    if _holders == 0:
        return
    _holders -= 1
    if _holders == 0 and not _frozen_by_application:
        gc.unfreeze()
