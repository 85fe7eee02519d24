"""The delivery checker finds each kind of fault it exists to find."""

from __future__ import annotations

from tests.chaos.checker import DeliveryChecker


def checker_with(received: list[str]) -> DeliveryChecker:
    c = DeliveryChecker()
    for message_id, key in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("n1", None)):
        c.committed(message_id, key)
    c.rolled_back("r1")
    for message_id in received:
        c.received(message_id)
    return c


def test_a_clean_run_passes_and_duplicates_are_counted_not_failed() -> None:
    report = checker_with(["a1", "b1", "a1", "a2", "n1"]).report()
    assert report.ok
    assert (report.lost, report.unexpected, report.duplicated, report.out_of_order) == (0, 0, 1, 0)


def test_lost_unexpected_and_out_of_order_each_fail_the_run() -> None:
    lost = checker_with(["a1", "a2", "n1"]).report()
    assert (lost.ok, lost.lost, lost.lost_ids) == (False, 1, ("b1",))
    unexpected = checker_with(["a1", "a2", "b1", "n1", "r1"]).report()
    assert (unexpected.ok, unexpected.unexpected) == (False, 1)
    disordered = checker_with(["a2", "a1", "b1", "n1"]).report()
    assert (disordered.ok, disordered.out_of_order, disordered.disordered_keys) == (
        False,
        1,
        ("a",),
    )


def test_a_late_duplicate_of_an_earlier_message_is_not_disorder() -> None:
    # a1 redelivered after a2 (a relay republished it): the first deliveries are in order.
    assert checker_with(["a1", "a2", "a1", "b1", "n1"]).report().ok
