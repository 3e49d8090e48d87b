"""The raw limit acknowledging by DELETE (compare with pg_scheduler_del)."""

from __future__ import annotations

import os

os.environ["RAW_LIMIT_ACK"] = "delete"

from c_raw_limit import Contender as _Base


class Contender(_Base):
    pass
