"""Who may read and who may act.

- Every read and every action needs the console's token (OUTBOX_CONSOLE_TOKEN): either
  `Authorization: Bearer <token>`, or a session from the login form. Reads may be opened to
  anyone on loopback by choice (`--open-reads`).
- A session is not a cookie: browsers send a host's cookies to every port of that host, so any
  local web server the operator visits would receive one. The login page hands the session's id
  to the page's script, which keeps it in the origin's own storage and sends it as
  `X-Console-Session`; another page cannot send that header here (that takes CORS, which this
  console never grants), and every write also needs the console's own Origin. A session ends
  after IDLE_SECONDS unused, and after SESSION_SECONDS whatever.
- Failed tokens (login or bearer) are rate limited per client (throttle.py): a 429 beyond.
- No credentials: 401. Wrong credentials (token, a foreign or missing Origin): 403. Either way
  nothing changes.

Tokens are compared in constant time. Sessions live in this process's memory: a restart logs
everyone out.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from relay.console.throttle import Throttle
from relay.runtime.logs import printable

SESSION_HEADER = "X-Console-Session"
IDLE_SECONDS = 30 * 60.0
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 1000  # the oldest goes first: memory stays bounded whatever logs in
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
    idle_until: float
    ends: float


@dataclass(frozen=True, slots=True)
class Caller:
    """A request allowed through: `who` is recorded with any change it makes."""

    who: str
    session: Session | None = None  # set when it came through a login session


@dataclass(frozen=True, slots=True)
class Denied:
    status: int  # 401, 403 or 429
    reason: str
    retry_after: int | None = None  # seconds, with a 429


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request presents."""

    authorization: str | None
    session: str | None  # X-Console-Session
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
        self.throttle = Throttle(clock)

    @property
    def actions_on(self) -> bool:
        return self.token is not None

    # ----------------------------------------------------------------- sessions

    def login(self, offered: str, name: str, client: str) -> str | Denied:
        """A new session's id when `offered` is the token; why not otherwise."""
        slowed = self._slowed(client)
        if slowed is not None:
            return slowed
        if not self._matches(offered):
            self.throttle.failed(client)
            return Denied(403, "wrong token")
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        session = Session(clean_name(name) or "console", now + IDLE_SECONDS, now + SESSION_SECONDS)
        with self._lock:
            while len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[sid] = session
        return sid

    def logout(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._sessions.pop(sid, None)

    def session(self, sid: str | None) -> Session | None:
        """The live session `sid` names (its idle time starts again), or None."""
        if not sid:
            return None
        now = self._clock()
        with self._lock:
            found = self._sessions.get(sid)
            if found is None:
                return None
            if min(found.idle_until, found.ends) <= now:
                del self._sessions[sid]
                return None
            found = replace(found, idle_until=now + IDLE_SECONDS)
            self._sessions[sid] = found
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
            slowed = self._slowed(creds.client)
            if slowed is not None:
                return slowed
            if not self._matches(bearer):
                self.throttle.failed(creds.client)
                return Denied(403, "wrong token")
            who = clean_name(creds.operator or "") or "token"
            return Caller(f"console:{who}@{creds.client}")
        if creds.session:
            session = self.session(creds.session)
            if session is None:
                return Denied(401, "the session has ended: log in again")
            if write and (creds.origin is None or not same_origin(creds.origin, creds.host)):
                return Denied(403, "actions come from the console's own page only (Origin)")
            return Caller(f"console:{session.name}@{creds.client}", session)
        if not write and self.open_reads:
            return Caller(f"console@{creds.client}")
        if write and not self.actions_on:
            return Denied(403, "actions are off: start the console with OUTBOX_CONSOLE_TOKEN set")
        return Denied(401, "log in, or send Authorization: Bearer <OUTBOX_CONSOLE_TOKEN>")

    def _slowed(self, client: str) -> Denied | None:
        wait = self.throttle.wait(client)
        if not wait:
            return None
        seconds = max(1, math.ceil(wait))
        return Denied(429, f"too many wrong tokens from here: try again in {seconds} s", seconds)

    def _matches(self, offered: str) -> bool:
        if self.token is None:
            return False
        return hmac.compare_digest(offered.encode(), self.token.encode())


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def same_origin(origin: str | None, host: str | None) -> bool:
    # Browsers send Origin with every POST; a login form posted without one is not from another
    # page (actions need one: Gate.check).
    if origin is None:
        return True
    return host is not None and origin in (f"http://{host}", f"https://{host}")


def clean_name(raw: str) -> str:
    """A name as recorded: one printable line, at most NAME_CHARS characters."""
    return printable(" ".join(raw.split()))[:NAME_CHARS]
