"""TLS to the broker: the --amqp-ca-file, --amqp-cert-file, --amqp-key-file and
--amqp-server-name options, and the ssl.SSLContext they make.

No pika here (the configuration imports this to check the files while it validates, and
commands that never talk to the broker must not load pika); relay/amqp/nodes.py hands the
context to pika.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """How to talk TLS to amqps:// nodes. Nothing given: pika's default, the system's CAs and
    each URL's host as the name to check."""

    ca_file: str | None = None  # PEM CA certificates to verify the broker with, not the system's
    cert_file: str | None = None  # PEM client certificate (and its key, unless key_file)
    key_file: str | None = None  # PEM private key of cert_file, unencrypted
    server_name: str | None = None  # SNI and the name the certificate must carry

    @property
    def given(self) -> tuple[str, ...]:
        """The flags of the options that are set, in the order --help lists them."""
        return tuple(
            flag
            for flag, value in (
                ("--amqp-ca-file", self.ca_file),
                ("--amqp-cert-file", self.cert_file),
                ("--amqp-key-file", self.key_file),
                ("--amqp-server-name", self.server_name),
            )
            if value is not None
        )

    def context(self) -> ssl.SSLContext:
        """The client context: certificates and host names verified (always), against ca_file
        or the system's CAs, with the client certificate when one is given. ValueError naming
        the flag when a file cannot be used."""
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("--amqp-key-file needs --amqp-cert-file (the certificate it signs)")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"--amqp-ca-file: {self.ca_file!r} holds no usable PEM CA certificate "
                    f"({_reason(exc)})"
                ) from None
        if self.cert_file is not None:
            try:
                # A key that needs a passphrase fails here: without `password`, OpenSSL would
                # prompt on the terminal and a relay would hang at start.
                context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
            except (ssl.SSLError, OSError, _EncryptedKey) as exc:
                raise ValueError(_chain_problem(self.cert_file, self.key_file, exc)) from None
        return context


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def _reason(exc: BaseException) -> str:
    """ssl's reason code ("KEY_VALUES_MISMATCH") or the OS error, in a few words."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    # "[SSL] PEM lib (_ssl.c:3926)": the source line of CPython says nothing to an operator.
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(exc)) or type(exc).__name__


def _chain_problem(cert_file: str, key_file: str | None, exc: BaseException) -> str:
    if isinstance(exc, _EncryptedKey):
        return (
            f"--amqp-key-file: the key of {cert_file!r} is encrypted; give an unencrypted key "
            "(mounted as a secret): the relay cannot ask for a passphrase"
        )
    if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
        return f"--amqp-key-file: {key_file or cert_file!r} is not the key of {cert_file!r}"
    if key_file is None:
        return (
            f"--amqp-cert-file: cannot read a PEM certificate and its private key from "
            f"{cert_file!r}; give the key with --amqp-key-file when it is in a file of its own"
        )
    return (
        f"--amqp-cert-file/--amqp-key-file: cannot load the client certificate {cert_file!r} "
        f"with the key {key_file!r} ({_reason(exc)})"
    )
