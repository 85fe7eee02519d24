"""Message ids: UUID version 7 (RFC 9562), time-ordered.

Ids that grow with time land at the right edge of the id index instead of on random pages, so
inserting millions of them stays cheap, and operators can sort messages by id.
"""

from __future__ import annotations

import os
import time
import uuid


def new_id() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 random bits; 74 are used
    return uuid.UUID(
        int=(ms & 0xFFFF_FFFF_FFFF) << 80  # unix_ts_ms: 48 bits
        | ((rand >> 62) & 0xFFF) << 64  # rand_a: 12 bits
        | rand & 0x3FFF_FFFF_FFFF_FFFF  # rand_b: 62 bits
        | _VERSION_VARIANT
    )


_VERSION_VARIANT = 0x7 << 76 | 0b10 << 62  # version 7, RFC 9562 variant
