"""TLS for the tests without touching the machine's RabbitMQ: certificates made with the `openssl`
command, and a TLS-terminating proxy (tests/support/proxy.py's, with a handshake in front) that
forwards to the plain broker port.

    certs = make_certificates(tmp_path)            # a CA, a server and a client certificate
    with TlsProxy(("127.0.0.1", 5672), certs) as proxy:
        amqps://guest:guest@127.0.0.1:{proxy.port}/%2F   (--amqp-server-name rabbit.test)

The server certificate names only `rabbit.test` (DNS), so a client checking the host it dialled
(127.0.0.1) refuses it: the server-name option is needed, as behind a load balancer. With
`client_ca`, the proxy requires a client certificate signed by it (mutual TLS).
"""

from __future__ import annotations

import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.proxy import TcpProxy

SERVER_NAME = "rabbit.test"


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA that signed server and client
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: the wrong one to trust


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _key_and_request(name: str, subject: str, cwd: Path) -> None:
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=cwd)  # fmt: skip


def _self_signed_ca(name: str, subject: str, cwd: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", subject,
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=cwd)  # fmt: skip


def _sign(name: str, extensions: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
             "-extfile", f"{name}.ext", cwd=cwd)  # fmt: skip


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server certificate for SERVER_NAME and a client certificate, both signed by it,
    and a second CA that signed neither; EC keys, valid two days, unencrypted."""
    directory.mkdir(parents=True, exist_ok=True)
    _self_signed_ca("ca", "/CN=outbox-relay test CA", directory)
    _self_signed_ca("other-ca", "/CN=someone else's CA", directory)
    _key_and_request("server", f"/CN={SERVER_NAME}", directory)
    _sign("server", f"subjectAltName=DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth\n"
          "basicConstraints=CA:FALSE\n", directory)  # fmt: skip
    _key_and_request("client", "/CN=outbox-relay", directory)
    _sign("client", "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n", directory)
    return Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )


def _common_name(cert: Any) -> str:
    """The subject CN of a peer certificate as ssl hands it over ("" for none):
    {"subject": ((("commonName", "x"),), ...)}."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


class TlsProxy(TcpProxy):
    """Accepts TLS on 127.0.0.1 (a free port), forwards the plain bytes to `target`.

    `handshakes` lists the client certificate subject CN of each completed handshake ("" when
    the client sent none); `refused` counts handshakes that failed (the client did not trust us,
    or sent no certificate when one is required)."""

    def __init__(
        self, target: tuple[str, int], certs: Certificates, *, client_ca: Path | None = None
    ) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs.server_cert, certs.server_key)
        if client_ca is not None:
            context.load_verify_locations(cafile=client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        self._context = context
        self.handshakes: list[str] = []
        self.refused = 0
        super().__init__(*target)

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "%2F") -> str:
        return f"amqps://{user}:{password}@127.0.0.1:{self.port}/{vhost}"

    def _wrap(self, client: socket.socket) -> socket.socket | None:
        try:
            client.settimeout(10)
            # The handshake happens here; `client` is detached from then on (`tls` owns the fd).
            tls = self._context.wrap_socket(client, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError):
            with self._lock:
                self.refused += 1
            client.close()
            return None
        with self._lock:
            self.handshakes.append(_common_name(tls.getpeercert()))
        return tls
