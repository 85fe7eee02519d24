"""`outbox-relay sql`: every statement the store runs, as the database receives it, printed without
a database (relay/cli/sql.py)."""

from __future__ import annotations

import re

import pytest

from relay.store.databases import DIALECTS, dialect_for
from tests.support.cli import in_process

BLOCK = re.compile(r"^-- (\w+) --$", re.M)


@pytest.mark.parametrize("backend", sorted(DIALECTS))
def test_every_statement_is_printed_whole_under_its_name(backend: str) -> None:
    code, out, err = in_process("sql", "--dialect", backend)
    assert (code, err) == (0, "")
    names = BLOCK.findall(out)
    assert names == list(dialect_for(backend).texts())
    assert "{{" not in out
    assert "stuck_expired" in names
    assert "transition_rows" in names


def test_one_statement_in_the_configuration_given() -> None:
    code, out, _ = in_process(
        "sql", "--dialect", "postgresql", "--dead-key", "skip", "--circuit-scope", "broker",
        "unpark_sweep",
    )  # fmt: skip
    assert code == 0
    assert (
        out.strip()
        == dialect_for("postgresql", hold=False, scope="broker").texts()["unpark_sweep"].strip()
    )
    assert "'dead'" not in out


def test_the_database_is_the_one_db_names_unless_dialect_says() -> None:
    code, out, _ = in_process("--db", "mysql://u@h/db", "sql", "candidates")
    assert code == 0
    assert "FORCE INDEX (outbox_message_claim_idx)" in out


def test_a_name_no_statement_has_is_a_usage_error_in_one_line() -> None:
    code, out, err = in_process("sql", "--dialect", "sqlite", "nothing")
    assert (code, out) == (2, "")
    assert "no statement named 'nothing' on sqlite" in err
    assert len(err.strip().splitlines()) == 1
