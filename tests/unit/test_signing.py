"""Signing and verifying in the Standard Webhooks scheme, as pure rules: the signature is the
scheme's (the Python `standardwebhooks` package makes the same one), any changed byte of the body,
id or timestamp fails, any listed secret verifies, a bad secret is named by its position and never
quoted, and no repr or error of the relay's configuration shows one."""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks import Webhook

import outbox
from outbox.signing import InvalidSecret, Signer, new_secret, secret_keys, signer, verify
from relay.amqp.frames import decode_properties
from relay.amqp.wire import to_outgoing
from relay.cli import main as cli
from relay.core.signing import keyring_of, keys_text, keys_toml
from relay.errors import ConfigError
from relay.ports import Claimed, MalformedRow
from relay.runtime.config import RelayConfig

# Fixed, not new_secret(): they appear in parametrized test ids, which every xdist worker must
# collect alike.
SECRETS = ["whsec_" + base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2, 3)]
NOW = 1_800_000_000


def signed(body: bytes, *secrets: str, message_id: str = "m-1", at: int = NOW) -> dict[str, str]:
    return Signer(secret_keys(list(secrets)), clock=lambda: at).headers(message_id, body)


# --------------------------------------------------------------------------- the scheme


@settings(max_examples=60, deadline=None)
@given(message_id=st.text(min_size=1, max_size=40), body=st.text(max_size=300))
def test_the_signature_is_the_standard_webhooks_one(message_id: str, body: str) -> None:
    secret = SECRETS[0]
    headers = signed(body.encode(), secret, message_id=message_id)
    theirs = Webhook(secret).sign(message_id, dt.datetime.fromtimestamp(NOW, dt.UTC), body)
    assert headers["webhook-signature"] == theirs
    assert headers["webhook-id"] == message_id
    assert headers["webhook-timestamp"] == str(NOW)


def test_the_standard_webhooks_package_verifies_a_fresh_message() -> None:
    body = b'{"id": 7, "total": "12.50"}'
    headers = Signer(secret_keys(SECRETS[0])).headers(str(uuid.uuid4()), body)
    assert Webhook(SECRETS[0]).verify(body, headers) == {"id": 7, "total": "12.50"}


@settings(max_examples=80, deadline=None)
@given(body=st.binary(min_size=1, max_size=200), data=st.data())
def test_any_changed_byte_of_the_body_fails(body: bytes, data: st.DataObject) -> None:
    headers = signed(body, SECRETS[0])
    verify(body, headers, SECRETS[0])
    at = data.draw(st.integers(0, len(body) - 1))
    flip = data.draw(st.integers(1, 255))
    changed = body[:at] + bytes([body[at] ^ flip]) + body[at + 1 :]
    with pytest.raises(outbox.BadSignature, match="no signature matches"):
        verify(changed, headers, SECRETS[0])
    with pytest.raises(outbox.BadSignature):
        verify(body + b" ", headers, SECRETS[0])


@pytest.mark.parametrize(
    ("header", "value"),
    [("webhook-id", "m-2"), ("webhook-timestamp", str(NOW + 1)), ("webhook-timestamp", "0")],
)
def test_a_changed_id_or_timestamp_fails(header: str, value: str) -> None:
    headers = {**signed(b"{}", SECRETS[0]), header: value}
    with pytest.raises(outbox.BadSignature, match="no signature matches"):
        verify(b"{}", headers, SECRETS[0])


def test_every_secret_signs_and_any_one_verifies() -> None:
    headers = signed(b"x", SECRETS[0], SECRETS[1])
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secrets in (SECRETS[0], SECRETS[1], [SECRETS[2], SECRETS[1]], f"{SECRETS[2]},{SECRETS[0]}"):
        verify(b"x", headers, secrets)
    with pytest.raises(outbox.BadSignature):
        verify(b"x", headers, SECRETS[2])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"webhook-signature": None}, "no webhook-signature header"),
        ({"webhook-id": None, "webhook-timestamp": None}, "no webhook-id, webhook-timestamp"),
        ({"webhook-signature": " "}, "no webhook-signature header"),
        ({"webhook-timestamp": "soon"}, "is not integer seconds"),
        ({"webhook-timestamp": "-5"}, "is not integer seconds"),
        ({"webhook-signature": "v1a,AAAA v2,BBBB"}, "no signature matches"),
        ({"webhook-signature": "v1,not base64 at all"}, "no signature matches"),
    ],
)
def test_missing_or_malformed_headers_are_refused(
    change: dict[str, str | None], words: str
) -> None:
    headers: dict[str, Any] = signed(b"{}", SECRETS[0])
    for name, value in change.items():
        if value is None:
            del headers[name]
        else:
            headers[name] = value
    with pytest.raises(outbox.BadSignature, match=words):
        verify(b"{}", headers, SECRETS[0])


def test_header_names_in_any_case_and_values_as_bytes_verify() -> None:
    headers = signed(b"{}", SECRETS[0])
    as_received = {name.upper(): value.encode() for name, value in headers.items()}
    verify(b"{}", as_received, SECRETS[0])


def test_other_versions_are_skipped_and_a_later_v1_verifies() -> None:
    headers = signed(b"{}", SECRETS[0])
    headers["webhook-signature"] = "v1a,xyz v1,AAAA " + headers["webhook-signature"]
    verify(b"{}", headers, SECRETS[0])


@pytest.mark.parametrize(
    ("age", "max_age", "ok"),
    [(10, None, True), (10**7, None, True), (299, 300, True), (301, 300, False),
     (-299, 300, True), (-301, 300, False)],
)  # fmt: skip
def test_max_age_is_checked_only_when_given(age: int, max_age: float | None, ok: bool) -> None:
    headers = signed(b"{}", SECRETS[0], at=NOW - age)
    if ok:
        verify(b"{}", headers, SECRETS[0], max_age=max_age, now=NOW)
    else:
        with pytest.raises(outbox.BadSignature, match=r"max_age|future"):
            verify(b"{}", headers, SECRETS[0], max_age=max_age, now=NOW)


# --------------------------------------------------------------------------- secrets

SHORT = "whsec_" + base64.b64encode(b"x" * 10).decode()
LONG = "whsec_" + base64.b64encode(b"x" * 65).decode()


@pytest.mark.parametrize(
    ("secrets", "words"),
    [
        ("", "no secret given"),
        ("whsec_", "the secret is empty after whsec_"),
        ("c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "the secret does not start with whsec_"),
        ("whsec_!!not-base64!!", "the secret is not whsec_ followed by base64"),
        (SHORT, "the secret decodes to 10 bytes"),
        (LONG, "the secret decodes to 65 bytes"),
        (f"{SECRETS[0]},whsec_%%%", "secret 2 of 2 is not whsec_ followed by base64"),
        (f"{SECRETS[0]},,{SECRETS[1]}", "secret 2 of 3 is empty"),
        ([SECRETS[0], SHORT], "secret 2 of 2 decodes to 10 bytes"),
    ],
)
def test_a_bad_secret_is_named_by_its_position_never_quoted(
    secrets: str | list[str], words: str
) -> None:
    with pytest.raises(InvalidSecret) as refused:
        secret_keys(secrets)
    assert words in str(refused.value)
    for part in [secrets] if isinstance(secrets, str) else secrets:
        for piece in part.split(","):
            if len(piece) > 8:
                assert piece.removeprefix("whsec_") not in str(refused.value)


def test_a_signer_shows_no_secret_and_verify_caches_it() -> None:
    assert repr(signer(SECRETS[0])) == "Signer(1 secret)"
    assert signer(SECRETS[0]) is signer(SECRETS[0])
    assert signer([SECRETS[0], SECRETS[1]]) is signer((SECRETS[0], SECRETS[1]))


# --------------------------------------------------------------------------- the relay's keys


def test_the_file_gives_secrets_per_exchange_over_the_variables_default() -> None:
    file = keys_toml(f'[exchanges]\norders = ["{SECRETS[1]}", "{SECRETS[2]}"]\n"" = "{SECRETS[2]}"')
    ring = keyring_of(keys_text(SECRETS[0]), file)
    assert ring is not None
    body = b"{}"
    for exchange, expected in (("orders", 2), ("", 1), ("audit", 1)):
        chosen = ring.for_exchange(exchange)
        assert chosen is not None
        headers = chosen.headers("m", body)
        assert len(headers["webhook-signature"].split()) == expected
    verify(body, ring.for_exchange("audit").headers("m", body), SECRETS[0])  # type: ignore[union-attr]
    verify(body, ring.for_exchange("").headers("m", body), SECRETS[2])  # type: ignore[union-attr]
    assert keyring_of(None, None) is None
    only_file = keyring_of(None, keys_toml(f'[exchanges]\norders = "{SECRETS[0]}"'))
    assert only_file is not None
    assert only_file.for_exchange("audit") is None  # unsigned


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "names no secret"),
        ("default = [", "is not TOML"),
        ('secrets = ["x"]', "unknown keys secrets"),
        ("exchanges = 5", "exchanges must be a table"),
        ("default = []", "default: the list of secrets is empty"),
        ("default = 5", "default: give a list of secrets, or one string"),
        ("[exchanges]\norders = [1]", "exchanges.orders: secrets must be strings"),
        (f'[exchanges]\norders = ["{SECRETS[0]}", "whsec_x"]',
         "exchanges.orders: secret 2 of 2 is not whsec_ followed by base64"),
    ],
)  # fmt: skip
def test_a_bad_file_says_where(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as refused:
        keys_toml(text)
    assert SECRETS[0] not in str(refused.value)


def test_the_variable_and_the_files_default_cannot_both_sign_everything() -> None:
    with pytest.raises(ConfigError, match="keep one"):
        RelayConfig(
            signing_keys=keys_text(SECRETS[0]),
            signing_keys_file=keys_toml(f'default = "{SECRETS[1]}"'),
        )


def test_no_repr_of_the_configuration_shows_a_secret() -> None:
    config = RelayConfig(
        signing_keys=keys_text(",".join(SECRETS[:2])),
        signing_keys_file=keys_toml(f'[exchanges]\norders = "{SECRETS[2]}"'),
    )
    shown = repr(config)
    assert "Keyring(default=Signer(2 secrets), exchanges=[])" in shown
    for secret in SECRETS:
        assert secret.removeprefix("whsec_")[:12] not in shown


# --------------------------------------------------------------------------- on the wire


def claimed(body: bytes, **fields: Any) -> Claimed:
    row: dict[str, Any] = {
        "seq": 1, "id": str(uuid.uuid4()), "exchange": "orders", "routing_key": "order.created",
        "payload": body, "content_type": "application/json", "headers": {"tenant": "a"},
        "key": None, "traceparent": None, "tracestate": None, "attempts": 1, "priority": 0,
        "max_attempts": None, "created_at": dt.datetime.now(dt.UTC),
        "available_at": dt.datetime.now(dt.UTC),
    }  # fmt: skip
    row.update(fields)
    return Claimed(**row)


def test_the_wire_message_is_signed_over_its_exact_body() -> None:
    body = b'{"id": 1}'
    row = claimed(body)
    out = to_outgoing(row, signer=signer(SECRETS[0]))
    assert out.body is body or out.body == body
    headers = decode_properties(out.header).headers
    assert headers["tenant"] == "a"
    assert headers["webhook-id"] == str(row.id) == decode_properties(out.header).message_id
    verify(out.body, headers, SECRETS[0])
    assert "webhook-signature" not in (decode_properties(to_outgoing(row).header).headers or {})


def test_a_callers_webhook_header_is_replaced_by_the_signature() -> None:
    row = claimed(b"{}", headers={"webhook-signature": "v1,forged"})
    out = to_outgoing(row, signer=signer(SECRETS[0]))
    assert decode_properties(out.header).headers["webhook-signature"] != "v1,forged"
    verify(b"{}", decode_properties(out.header).headers, SECRETS[0])


def test_the_signature_headers_count_towards_the_frame() -> None:
    row = claimed(b"{}", headers={"h": "x" * 300})
    unsigned = to_outgoing(row, frame_max=4096)
    assert decode_properties(unsigned.header).headers is not None
    with pytest.raises(MalformedRow, match="frame_max"):
        to_outgoing(row, frame_max=600, signer=signer(",".join(SECRETS)))


# --------------------------------------------------------------------------- the command line


@pytest.fixture
def no_outbox_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("OUTBOX_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "OUTBOX_SIGNING_KEYS: is empty"),
        ("  ", "OUTBOX_SIGNING_KEYS: is empty"),
        ("hunter2hunter2hunter2hunter2", "OUTBOX_SIGNING_KEYS: the secret does not start"),
        (f"{SECRETS[0]},whsec_hunter2%", "OUTBOX_SIGNING_KEYS: secret 2 of 2 is not whsec_"),
        ("whsec_aHVudGVyMmh1bnRlcjI=", "OUTBOX_SIGNING_KEYS: the secret decodes to 14 bytes"),
    ],
)
def test_a_bad_secret_exits_2_in_one_line_naming_the_variable_not_the_value(
    value: str,
    words: str,
    no_outbox_environment: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OUTBOX_SIGNING_KEYS", value)
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("outbox-relay: error: "), err
    assert words in err
    assert len(err.splitlines()) == 1
    assert "hunter2" not in err
    assert "aHVudGVy" not in err
    assert SECRETS[0][6:] not in err


def test_a_bad_flag_value_is_not_echoed_either(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--signing-keys", "whsec_hunter2hunter2%"]) == 2
    err = capsys.readouterr().err
    assert "--signing-keys" in err
    assert "hunter2" not in err


def test_a_bad_file_exits_2_naming_the_variable_and_where(
    tmp_path: Path,
    no_outbox_environment: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[exchanges]\norders = ["{SECRETS[0]}", "whsec_hunter2%"]\n')
    monkeypatch.setenv("OUTBOX_SIGNING_KEYS_FILE", str(path))
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert f"OUTBOX_SIGNING_KEYS_FILE: '{path}': exchanges.orders: secret 2 of 2" in err
    assert "hunter2" not in err
    assert SECRETS[0][6:] not in err
    assert len(err.splitlines()) == 1


def test_a_secret_given_for_the_files_path_is_not_echoed(
    no_outbox_environment: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OUTBOX_SIGNING_KEYS_FILE", SECRETS[0])
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert "OUTBOX_SIGNING_KEYS_FILE: holds a secret, not a path" in err
    assert SECRETS[0][6:] not in err


def test_help_and_status_never_show_a_secret(
    no_outbox_environment: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OUTBOX_SIGNING_KEYS", SECRETS[0])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--help"]) == 0
    assert cli.main(["--db", f"sqlite:///{tmp_path}/x.db", "status"]) in (0, 1)
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "OUTBOX_SIGNING_KEYS" in said
    assert SECRETS[0][6:] not in said


def test_a_new_secret_is_a_whsec_secret_of_32_random_bytes() -> None:
    one, two = new_secret(), new_secret()
    assert one.startswith("whsec_")
    assert one != two
    assert [len(key) for key in secret_keys([one, two])] == [32, 32]
