"""`make soak` in a few seconds: the real relay at a small rate, a line per sample with every
column, the relay's warnings and a verdict (benchmarks/soak.py; `make soak` runs 30 minutes)."""

from __future__ import annotations

import re

import pytest

from benchmarks import soak


def test_a_short_soak_prints_a_line_per_sample_and_a_verdict(
    amqp_url: str, pg_admin: object, capsys: pytest.CaptureFixture[str]
) -> None:
    code = soak.main(["--minutes", "0.1", "--every", "1.5", "--rate", "200", "--retain", "5s",
                      "--warm-up", "0", "--vacuum-every", "2"])  # fmt: skip
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("soak: PostgreSQL"), out
    assert soak.HEADER in lines
    rows = [line for line in lines if re.match(r"^ +\d+\.\d\d +\d", line)]
    assert len(rows) == 4, out
    for row in rows:
        _minute, rss, table, _claim, written, published, _ready, _dead = row.split()
        assert float(rss) > 10
        assert float(table) > 0
        assert float(written) > 100
        assert float(published) > 0
    assert "verdict, after a 0.0 min warm-up" in out
    assert {"rss", "table", "claim"} <= {line.split()[0] for line in lines if "->" in line}
    assert code in (0, 1), out  # a few seconds say nothing of flatness: only that it ran
