from __future__ import annotations

import time
import uuid

from outbox.ids import new_id


def test_ids_are_version_7_rfc_variant_and_unique() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)


def test_ids_carry_the_time_and_sort_by_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    first = new_id()
    time.sleep(0.002)
    second = new_id()
    assert first.int >> 80 >= before
    assert first < second
