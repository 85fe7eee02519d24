"""Why a connection to the broker failed, when TLS is the reason, in an operator's words.

pika wraps the ssl module's error two levels deep ("AMQPConnectionWorkflowFailed: 1 exceptions
in all; last exception - AMQPConnectorTransportSetupError: SSLCertVerificationError(...)"); the
certificate's verdict and the options that fix it are what an operator needs. The text avoids
the words relay.errors.plain_broker_error reads as other causes ("SSL", "timed out").
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

_CLIENT_CERT_HINT = "check --amqp-cert-file and --amqp-key-file"


def connect_error(err: BaseException) -> str:
    """The reason a connection attempt failed: `tls_problem`'s, else pika's own text."""
    return tls_problem(err) or str(err) or repr(err)


def tls_problem(err: BaseException) -> str | None:
    """What went wrong in TLS, or None when TLS is not the reason (or not one this names)."""
    for exc in _causes(err):
        if isinstance(exc, ssl.SSLCertVerificationError):
            verdict = str(exc.verify_message or exc.reason or "not trusted").rstrip(".")
            return (
                f"the broker's TLS certificate was refused ({verdict}): check --amqp-ca-file "
                "(the CA that signed it) and --amqp-server-name (the name it carries)"
            )
        if isinstance(exc, ssl.SSLError) and "CERTIFICATE" in str(exc.reason or "").upper():
            # An alert from the broker during the handshake (TLS 1.2): it wanted a client
            # certificate, or did not trust the one it got.
            alert = str(exc.reason).lower().replace("_", " ")
            return f"the broker refused the client certificate ({alert}): {_CLIENT_CERT_HINT}"
        text = str(exc)
        if "Stream connection lost" in text and ("SSLEOFError" in text or "_ALERT_" in text):
            # TLS 1.3: the client's side of the handshake completes before the broker checks
            # the client certificate; a refusal then ends the stream at once (pika reports
            # it as text, inside an IncompatibleProtocolError or a StreamLostError).
            return (
                "the broker ended the TLS session before the AMQP handshake, as brokers do that "
                f"require a client certificate or refuse the one given: {_CLIENT_CERT_HINT}"
            )
    return None


def _causes(err: BaseException) -> Iterator[BaseException]:
    """`err` and what pika wrapped in it: a workflow's attempts, a connector's transport error."""
    yield err
    for attempt in getattr(err, "exceptions", None) or ():
        if isinstance(attempt, BaseException):
            yield from _causes(attempt)
    inner = getattr(err, "exception", None)
    if isinstance(inner, BaseException):
        yield from _causes(inner)
