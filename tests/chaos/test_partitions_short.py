"""The partitions scenario, short (`make chaos` runs it at full length: tests/chaos/__main__.py):
3 consumer processes on 4 partitions, two SIGKILLed and restarted, a relay SIGKILL and a broker
connection cut; nothing lost, nothing processed twice, every key processed in commit order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import partitions, run

pytestmark = [pytest.mark.xdist_group("chaos"), pytest.mark.timeout(120)]


def test_partitioned_consumers_keep_each_keys_order_through_kills(
    amqp_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row, kills = partitions.run_partitions(
        "partitions: 3 consumers SIGKILLed x2, relay SIGKILL, broker cut",
        messages=2000, keys=50, partitions=4, consumers=3, rate=700.0, workdir=tmp_path,
        faults=partitions.Faults(consumer_kills=2, between=(0.5, 1.0), relay_kills=1,
                                 broker_cuts=1, cut_for=1.0),
        settle_timeout=60,
    )  # fmt: skip
    with capsys.disabled():
        print(f"\n{run.table([row])}\n{partitions.note(row, kills)}")
    logs = "".join(p.read_text()[-3000:] for p in tmp_path.glob("chaos-*.log"))
    assert kills == 2
    assert row.report.committed >= 1990
    assert row.ok, (row, logs)
    assert row.report.duplicated == 0, row  # processed twice: the inbox let one through
    assert row.connections_lost >= 1, logs  # the cut reached the relay
