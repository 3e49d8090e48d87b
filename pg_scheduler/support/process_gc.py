"""``Scheduler(gc_freeze=True)``, the default: keep Python's full garbage collections short
while a scheduler runs.

A full (generation 2) collection walks every tracked object of the process
and pauses the event loop meanwhile: on the benchmark machine 8-14 ms for the
~42,000 objects that importing pg_scheduler, asyncpg and pydantic leaves
behind, more in a real application. Under a drain one runs about once a
second, and every job that should start during it waits. ``gc.freeze()``
moves the objects alive at ``start()`` (modules, classes, the application's
long-lived state) out of those walks, so a full collection then costs about
a millisecond.

On by default. It is process-wide, and what it costs is bounded: objects
alive at ``start()`` that later become unreachable in a reference cycle (and
what they still hold) are not reclaimed while a scheduler with
``gc_freeze=True`` runs; everything else is collected as usual. The
last such scheduler to shut down unfreezes them, and the next full
collection reclaims what is garbage by then, unless the application had
frozen objects itself before (a pre-fork server does): then its freeze is
left as it was. ``Scheduler(gc_freeze=False)`` (``pg-scheduler worker
--no-gc-freeze``) leaves the collector alone.
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
