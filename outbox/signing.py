"""Signed messages, in the Standard Webhooks scheme (https://www.standardwebhooks.com/).

The relay signs what it publishes; a consumer checks it with `verify` here, or with any Standard
Webhooks library (Python `standardwebhooks`, npm `standardwebhooks`, ...), since the scheme is
theirs exactly:

- `webhook-id`: the message id; `webhook-timestamp`: integer seconds when it was signed;
- `webhook-signature`: `v1,<base64 of HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>`, one per
  secret, space-separated (while secrets rotate, each signs);
- secrets are `whsec_<base64>`; the HMAC key is the decoded bytes.

The body is the exact bytes on the wire: signing never changes it. Secrets are never part of a
message here: errors say which secret (its position) is wrong and why, never its text.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import time
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from secrets import token_bytes  # by name: `secrets` is a parameter below
from typing import Any

from outbox.errors import OutboxError

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
HEADERS = (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
PREFIX = "whsec_"
VERSION = "v1"
# The scheme recommends 24 to 64 random bytes; a shorter key is a guessable one.
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


class BadSignature(OutboxError):
    """A message's signature is missing, malformed, or made with none of the secrets given (or,
    with `max_age`, too old): it did not come from a relay holding one of them unchanged."""


class InvalidSecret(OutboxError, ValueError):
    """A signing secret is not `whsec_<base64>` of 24 to 64 bytes (the message never quotes it)."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of one `whsec_<base64>` secret; `InvalidSecret` saying what is wrong."""
    if not isinstance(secret, str):
        raise InvalidSecret(f"a secret must be a str, not {type(secret).__name__}")
    text = secret.strip()
    if not text:
        raise InvalidSecret("a secret is empty")
    if not text.startswith(PREFIX):
        raise InvalidSecret(f"a secret does not start with {PREFIX} (whsec_<base64>)")
    if text == PREFIX:
        raise InvalidSecret("a secret is empty after whsec_")
    try:
        key = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecret("a secret is not whsec_ followed by base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InvalidSecret(
            f"a secret decodes to {len(key)} bytes; the scheme takes "
            f"{MIN_KEY_BYTES} to {MAX_KEY_BYTES} random bytes"
        )
    return key


def secret_keys(secrets: str | Sequence[str]) -> tuple[bytes, ...]:
    """The keys of `secrets`: one secret, several separated by commas (as OUTBOX_SIGNING_KEYS
    holds them), or a sequence of them. `InvalidSecret` names the position of a bad one."""
    if isinstance(secrets, str):
        items = secrets.split(",")
    elif isinstance(secrets, Sequence):
        items = list(secrets)
    else:
        raise InvalidSecret(f"secrets must be a str or a sequence of str, not {type(secrets)}")
    if len(items) == 1 and isinstance(items[0], str) and not items[0].strip():
        raise InvalidSecret("no secret given")
    keys: list[bytes] = []
    for number, item in enumerate(items, 1):
        try:
            keys.append(secret_key(item))
        except InvalidSecret as exc:
            where = f"secret {number} of {len(items)}" if len(items) > 1 else "the secret"
            raise InvalidSecret(str(exc).replace("a secret", where, 1)) from None
    return tuple(keys)


def new_secret() -> str:
    """A fresh random secret (32 bytes), in the `whsec_<base64>` form."""
    return PREFIX + base64.b64encode(token_bytes(32)).decode("ascii")


class Signer:
    """Signs with a fixed set of keys; cheap per message: each key's HMAC state is computed
    once, and a message only copies it and feeds it the id, timestamp and body."""

    __slots__ = ("_clock", "_macs")

    def __init__(self, keys: Sequence[bytes], *, clock: Callable[[], float] = time.time) -> None:
        if not keys:
            raise InvalidSecret("a signer needs at least one secret")
        self._macs = tuple(hmac.new(key, digestmod="sha256") for key in keys)
        self._clock = clock

    def __repr__(self) -> str:  # never the keys
        return f"Signer({len(self._macs)} secret{'s' if len(self._macs) != 1 else ''})"

    def signature(self, message_id: str, timestamp: int, body: bytes) -> str:
        """The `webhook-signature` value: one `v1,<base64>` per key, space-separated."""
        prefix = f"{message_id}.{timestamp}.".encode()
        parts = []
        for mac in self._macs:
            h = mac.copy()
            h.update(prefix)
            h.update(body)  # no copy of the body into one signed string
            parts.append("v1," + binascii.b2a_base64(h.digest(), newline=False).decode("ascii"))
        return parts[0] if len(parts) == 1 else " ".join(parts)

    def verify(
        self,
        body: bytes,
        headers: Mapping[str, Any],
        *,
        max_age: float | None = None,
        now: float | None = None,
    ) -> str:
        """`verify` (below) with this signer's keys; returns the signed `webhook-id`."""
        message_id, timestamp, offered = _signed_headers(headers)
        if max_age is not None:
            age = (self._clock() if now is None else now) - timestamp
            if age > max_age:
                raise BadSignature(
                    f"the signature is {age:.0f} s old, over max_age ({max_age:g} s)"
                )
            if -age > max_age:
                raise BadSignature(f"the signature's timestamp is {-age:.0f} s in the future")
        expected = [s.encode() for s in self.signature(message_id, timestamp, body).split(" ")]
        for candidate in offered:
            if not candidate.startswith(VERSION + ","):
                continue  # another version of the scheme: not one this signer makes
            offered_bytes = candidate.encode("utf-8", "replace")
            for mine in expected:
                if hmac.compare_digest(mine, offered_bytes):
                    return message_id
        raise BadSignature(
            "no signature matches: the message was altered or signed with other keys"
        )

    def headers(self, message_id: str, body: bytes) -> dict[str, str]:
        """The three headers for a message signed now."""
        timestamp = int(self._clock())
        return {
            ID_HEADER: message_id,
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: self.signature(message_id, timestamp, body),
        }


@lru_cache(maxsize=64)  # a consumer checks every message with the same few secrets
def _signer(secrets: str | tuple[str, ...]) -> Signer:
    return Signer(secret_keys(secrets))


def signer(secrets: str | Sequence[str]) -> Signer:
    """A `Signer` for `secrets` (see `secret_keys`), built once per distinct set."""
    return _signer(secrets if isinstance(secrets, str) else tuple(secrets))


def verify(
    body: bytes,
    headers: Mapping[str, Any],
    secrets: str | Sequence[str],
    *,
    max_age: float | None = None,
    now: float | None = None,
) -> None:
    """Check that `body` and `headers` carry a signature made with one of `secrets`.

    Args:
        body: The message body exactly as received.
        headers: The AMQP headers (names in any case; values str or bytes).
        secrets: One `whsec_...` secret, several separated by commas (OUTBOX_SIGNING_KEYS's
            form), or a sequence of them: a signature made with any of them is accepted, which
            is what lets secrets rotate.
        max_age: Seconds a signature stays acceptable, and how far in the future its timestamp
            may be; None (the default) checks no age, since a message may wait in a queue for
            hours.
        now: The current time in seconds (default: the clock), for `max_age`.

    Raises:
        BadSignature: a header is missing or malformed, no signature matches (compared in
            constant time), or the timestamp is out of `max_age`.
        InvalidSecret: a secret is not `whsec_<base64>` (a configuration error, not the
            message's).
    """
    signer(secrets).verify(body, headers, max_age=max_age, now=now)


def _signed_headers(headers: Mapping[str, Any]) -> tuple[str, int, list[str]]:
    found: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower() if isinstance(name, str) else ""
        if lowered in HEADERS:
            if isinstance(value, bytes | bytearray):
                value = bytes(value).decode("utf-8", "replace")
            found[lowered] = value if isinstance(value, str) else str(value)
    missing = [name for name in HEADERS if not found.get(name, "").strip()]
    if missing:
        raise BadSignature(f"not signed: no {', '.join(missing)} header")
    stamp = found[TIMESTAMP_HEADER].strip()
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        raise BadSignature(f"{TIMESTAMP_HEADER} {stamp[:40]!r} is not integer seconds")
    return found[ID_HEADER], int(stamp), found[SIGNATURE_HEADER].split()
