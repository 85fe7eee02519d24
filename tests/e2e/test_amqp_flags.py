"""`outbox-relay` refuses broker options it cannot use before it starts: exit 2, one line on
stderr naming the option (and, in a list of nodes, which URL), passwords masked.

The combinations and files in detail are checked in-process (tests/unit/test_broker_urls.py);
here, as an operator meets them: a subprocess, flags and variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, cli, environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_tls_options_with_a_plain_amqp_node_exit_2(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")  # exists; never read: the URL is refused
    nodes = "amqps://relay:hunter22@a.example/%2F,amqp://relay:hunter22@b.example/%2F"
    result = cli("run", "--amqp", nodes, "--amqp-ca-file", str(ca), cwd=tmp_path)
    line = assert_one_line_error(result, 2)
    assert "--amqp-ca-file is for amqps:// URLs" in line
    assert "amqp://relay:***@b.example/%2F is not one" in line
    assert "hunter22" not in line


def test_a_bad_node_in_the_variable_is_named_by_its_place(tmp_path: Path) -> None:
    nodes = "amqp://relay:hunter22@a.example/%2F,amqp://relay:hunter22@b.example:0x1/%2F"
    env = environment(OUTBOX_AMQP_URL=nodes)
    result = cli("run", cwd=tmp_path, env=env)
    line = assert_one_line_error(result, 2)
    assert line.startswith("outbox-relay: error: OUTBOX_AMQP_URL: URL 2 of 2: "), line
    assert "has an invalid port" in line
    assert "hunter22" not in line
