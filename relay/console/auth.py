"""Who may read and who may act.

- Actions (every POST of the API) need the console's token (OUTBOX_CONSOLE_TOKEN): either
  `Authorization: Bearer <token>`, or a session from the login form, whose cookie is HttpOnly and
  SameSite=Strict, and whose CSRF token the page sends back in `X-CSRF-Token` (a form field for
  plain forms). Without a token configured the console only reads.
- Reads are open when the console listens on a loopback address only; elsewhere they need the
  token or a session too.
- No credentials: 401. Wrong credentials (token, CSRF token, a foreign Origin): 403. Either way
  nothing changes.

Tokens are compared in constant time. Sessions live in this process's memory: a restart logs
everyone out.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from relay.runtime.logs import printable

COOKIE = "outbox_console"
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 1000  # the oldest goes first: memory stays bounded whatever logs in
MIN_TOKEN = 16  # characters: a token shorter than this is refused at start
NAME_CHARS = 64


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Session:
    name: str  # who, for the attempt records; typed at login
    csrf: str
    expires: float


@dataclass(frozen=True, slots=True)
class Caller:
    """A request allowed through: `who` is recorded with any change it makes."""

    who: str
    session: Session | None = None  # set when it came through a login session


@dataclass(frozen=True, slots=True)
class Denied:
    status: int  # 401 or 403
    reason: str


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request presents."""

    authorization: str | None
    cookie: str | None
    csrf: str | None  # X-CSRF-Token, or the form's csrf field
    origin: str | None
    host: str | None
    operator: str | None  # X-Outbox-Operator: who a token-holding script acts for
    client: str  # the peer's address


class Gate:
    def __init__(
        self,
        token: str | None,
        *,
        open_reads: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = token
        self.open_reads = open_reads
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @property
    def actions_on(self) -> bool:
        return self.token is not None

    # ----------------------------------------------------------------- sessions

    def login(self, offered: str, name: str) -> str | None:
        """A new session's id when `offered` is the token; None otherwise."""
        if not self._matches(offered):
            return None
        sid = secrets.token_urlsafe(32)
        session = Session(
            clean_name(name) or "console",
            secrets.token_urlsafe(32),
            self._clock() + SESSION_SECONDS,
        )
        with self._lock:
            while len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[sid] = session
        return sid

    def logout(self, cookie: str | None) -> None:
        sid = session_id(cookie)
        if sid is not None:
            with self._lock:
                self._sessions.pop(sid, None)

    def session(self, cookie: str | None) -> Session | None:
        sid = session_id(cookie)
        if sid is None:
            return None
        with self._lock:
            found = self._sessions.get(sid)
            if found is not None and found.expires <= self._clock():
                del self._sessions[sid]
                found = None
        return found

    # ----------------------------------------------------------------- checks

    def check(self, creds: Credentials, *, write: bool) -> Caller | Denied:
        """Whether a request may read (write=False) or act (write=True), and as whom."""
        bearer = _bearer(creds.authorization)
        if bearer is not None:
            if not self.actions_on:
                if not write and self.open_reads:
                    return Caller(f"console@{creds.client}")
                return Denied(403, "this console has no token: start it with OUTBOX_CONSOLE_TOKEN")
            if not self._matches(bearer):
                return Denied(403, "wrong token")
            who = clean_name(creds.operator or "") or "token"
            return Caller(f"console:{who}@{creds.client}")
        session = self.session(creds.cookie)
        if session is not None:
            if write:
                if not same_origin(creds.origin, creds.host):
                    return Denied(403, "the request comes from another site (Origin)")
                if not creds.csrf or not hmac.compare_digest(
                    creds.csrf.encode(), session.csrf.encode()
                ):
                    return Denied(403, "missing or wrong CSRF token: reload the page")
            return Caller(f"console:{session.name}@{creds.client}", session)
        if not write and self.open_reads:
            return Caller(f"console@{creds.client}")
        if write and not self.actions_on:
            return Denied(403, "actions are off: start the console with OUTBOX_CONSOLE_TOKEN set")
        return Denied(401, "log in, or send Authorization: Bearer <OUTBOX_CONSOLE_TOKEN>")

    def _matches(self, offered: str) -> bool:
        if self.token is None:
            return False
        return hmac.compare_digest(offered.encode(), self.token.encode())


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def session_id(cookie: str | None) -> str | None:
    """The session id in a Cookie header."""
    for part in (cookie or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


def same_origin(origin: str | None, host: str | None) -> bool:
    # Browsers send Origin with every POST; a request without one is not from another page.
    if origin is None:
        return True
    return host is not None and origin in (f"http://{host}", f"https://{host}")


def clean_name(raw: str) -> str:
    """A name as recorded: one printable line, at most NAME_CHARS characters."""
    return printable(" ".join(raw.split()))[:NAME_CHARS]


def cookie_header(sid: str) -> str:
    return f"{COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/; Max-Age={int(SESSION_SECONDS)}"


def expired_cookie_header() -> str:
    return f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
