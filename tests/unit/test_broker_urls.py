"""Several broker URLs (a cluster's nodes) and the TLS options, as the configuration reads them:
lists split where a URL starts, every password masked, one circuit name per cluster, and each
bad value or combination refused in one line that names it (exit 2)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from relay.cli import main as cli
from relay.cli.options import configure
from relay.core.resources import broker_id
from relay.core.urls import node_name, redact, secrets_of, split_urls
from relay.errors import ConfigError
from relay.runtime.logs import one_line
from relay.runtime.urls import parse_amqp_url
from tests.support.tls import Certificates, make_certificates

A = "amqps://relay:pw-a@node-a.example:5671/orders"
B = "amqps://relay:pw-b@node-b.example/orders"


@pytest.fixture(autouse=True)
def no_outbox_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OUTBOX_")]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


# --------------------------------------------------------------------------- lists


@pytest.mark.parametrize(
    ("raw", "urls"),
    [
        ("amqp://h", ["amqp://h"]),
        (f"{A},{B}", [A, B]),
        (f" {A} , {B} ,", [A, B]),  # spaces and a trailing comma
        (f"{A},,{B}", [A, B]),
        # A comma that does not start a URL stays in its URL (a dict literal, a password).
        ("amqp://h/%2F?client_properties={'a':1,'b':2},amqp://k",
         ["amqp://h/%2F?client_properties={'a':1,'b':2}", "amqp://k"]),
        ("amqp://u:p,w@h/%2F", ["amqp://u:p,w@h/%2F"]),
    ],
)  # fmt: skip
def test_a_list_is_split_where_a_url_starts(raw: str, urls: list[str]) -> None:
    assert split_urls(raw) == urls


def test_every_password_of_a_list_is_masked() -> None:
    both = f"{A},{B}"
    assert redact(both) == (
        "amqps://relay:***@node-a.example:5671/orders,amqps://relay:***@node-b.example/orders"
    )
    line = one_line(f"cannot connect to {both}", secrets_of(both))
    assert "pw-a" not in line
    assert "pw-b" not in line


def test_nodes_are_named_host_and_port() -> None:
    assert node_name(A) == "node-a.example:5671"
    assert node_name(B) == "node-b.example:5671"  # amqps' default port
    assert node_name("amqp://[::1]/%2F") == "[::1]:5672"


def test_a_cluster_is_one_resource_whatever_the_order_of_its_nodes() -> None:
    assert broker_id(f"{A},{B}") == "node-a.example:5671,node-b.example:5671/orders"
    assert broker_id(f"{B},{A}") == broker_id(f"{A},{B}")
    assert broker_id(A) == "node-a.example:5671/orders"  # one node: as before


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("amqp://u:hunter22@a/%2F,amqp://u:hunter22@b:99999/%2F",
         "URL 2 of 2: 'amqp://u:***@b:99999/%2F' has an invalid port"),
        ("amqp://a/%2F,http://u:hunter22@b/", "URL 2 of 2: 'http://u:***@b/' is not an AMQP URL"),
        ("amqp://a/%2F,amqp://b/%2F?hunter22=1", "URL 2 of 2: unknown URL parameter"),
        ("amqp://a/x,amqp://b/y", "different virtual hosts ('x', 'y')"),
        ("amqp://u:hunter22@a,b:5672/%2F", "lists several hosts in one URL"),
        (",", "no URL is given"),
    ],
)  # fmt: skip
def test_a_bad_url_of_a_list_is_named(raw: str, words: str) -> None:
    with pytest.raises(ConfigError, match=r"^--amqp: ") as caught:
        parse_amqp_url(raw)
    assert words in str(caught.value)
    assert "hunter22@" not in str(caught.value)


# --------------------------------------------------------------------------- TLS options


def run_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`outbox-relay ARGV` refused as bad usage: exit 2, one line, which it returns."""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def test_the_tls_options_reach_the_configuration(certs: Certificates) -> None:
    argv = ["--amqp", "amqps://h/%2F", "run", "--amqp-ca-file", str(certs.ca),
            "--amqp-cert-file", str(certs.client_cert), "--amqp-key-file", str(certs.client_key),
            "--amqp-server-name", "rabbit.test"]  # fmt: skip
    config = configure(cli.build_parser().parse_args(argv), {})
    tls = config.amqp_tls
    files = (str(certs.ca), str(certs.client_cert), str(certs.client_key))
    assert (tls.ca_file, tls.cert_file, tls.key_file) == files
    assert tls.server_name == "rabbit.test"
    from_env = configure(
        cli.build_parser().parse_args(["run"]),
        {"OUTBOX_AMQP_URL": "amqps://h/%2F", "OUTBOX_AMQP_CA_FILE": str(certs.ca),
         "OUTBOX_AMQP_SERVER_NAME": "rabbit.test"},
    )  # fmt: skip
    assert from_env.amqp_tls.ca_file == str(certs.ca)
    assert from_env.amqp_tls.server_name == "rabbit.test"


def test_tls_options_need_amqps_urls(
    certs: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    line = run_exit_2(["--amqp", "amqps://a/%2F,amqp://u:hunter22@b/%2F", "run",
                       "--amqp-ca-file", str(certs.ca)], capsys)  # fmt: skip
    assert "--amqp-ca-file is for amqps:// URLs, and amqp://u:***@b/%2F is not one" in line


def test_tls_options_and_pikas_ssl_options_parameter_do_not_mix(
    certs: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"amqps://h/%2F?ssl_options={{'cafile':'{certs.ca}'}}"
    line = run_exit_2(["--amqp", url, "run", "--amqp-server-name", "rabbit.test"], capsys)
    assert "--amqp-server-name and the URL parameter ssl_options" in line


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"OUTBOX_AMQP_CA_FILE": "/nonexistent/ca.pem"},
         "OUTBOX_AMQP_CA_FILE='/nonexistent/ca.pem' does not exist"),
        ({"OUTBOX_AMQP_CERT_FILE": "/"}, "OUTBOX_AMQP_CERT_FILE='/' is not a file"),
        ({"OUTBOX_AMQP_SERVER_NAME": "https://rabbit"},
         "OUTBOX_AMQP_SERVER_NAME='https://rabbit' is not a host name"),
    ],
)  # fmt: skip
def test_a_tls_variable_that_cannot_be_used_is_named(
    env: dict[str, str],
    words: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OUTBOX_AMQP_URL", "amqps://h/%2F")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert words in run_exit_2(["run"], capsys)


def test_files_that_are_not_what_their_option_says_are_named(
    certs: Certificates, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    amqps = ["--amqp", "amqps://h/%2F", "run"]
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    line = run_exit_2([*amqps, "--amqp-ca-file", str(not_pem)], capsys)
    assert f"--amqp-ca-file: {str(not_pem)!r} holds no usable PEM CA certificate" in line
    line = run_exit_2([*amqps, "--amqp-key-file", str(certs.client_key)], capsys)
    assert "--amqp-key-file needs --amqp-cert-file" in line
    # The server's key is not the client certificate's.
    line = run_exit_2([*amqps, "--amqp-cert-file", str(certs.client_cert),
                       "--amqp-key-file", str(certs.server_key)], capsys)  # fmt: skip
    assert f"{str(certs.server_key)!r} is not the key of {str(certs.client_cert)!r}" in line
    line = run_exit_2([*amqps, "--amqp-cert-file", str(certs.client_cert)], capsys)
    assert "cannot read a PEM certificate and its private key" in line


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    certs: Certificates, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    encrypted = tmp_path / "client-encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(certs.client_key), "-aes256", "-passout", "pass:secret",
         "-out", str(encrypted)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    argv = ["--amqp", "amqps://h/%2F", "run", "--amqp-cert-file", str(certs.client_cert),
            "--amqp-key-file", str(encrypted)]  # fmt: skip
    line = run_exit_2(argv, capsys)
    assert "is encrypted; give an unencrypted key" in line
