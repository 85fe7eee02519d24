"""The console as one Starlette application: its routes, the Guard every request passes (the
host check, the gate, the security headers), and the errors mapped to the console's answers
(`{"error": ...}` for the API, an error page otherwise)."""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay.console import pages
from relay.console.app import Console, answer, credentials
from relay.console.auth import SESSION_HEADER, Denied, is_loopback
from relay.console.filters import BadRequest
from relay.console.layout import Viewer
from relay.errors import DatabaseUnavailable, PermissionDenied, SchemaNotFound

log = logging.getLogger("relay")

MAX_BODY = 1024 * 1024
# Requests one client may have in progress at once: fewer than the pool's connections
# (server.POOL_SIZE), so one client cannot take them all; beyond, a 429 at once.
PER_CLIENT = 3
BODY_DEADLINE = 10.0  # seconds from a request's head to the end of its body
# Sent with every answer: no framing, no sniffing, no script or style but our own files.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; "
        "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer browsers send `Origin: null` with a POST,
    # and the login form's same-origin check could not tell its own page from another site.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# Served to anyone: the assets, and the login and logout forms (which check for themselves).
PUBLIC = frozenset(
    {"/static/console.css", "/static/console.js", "/favicon.ico", "/login", "/logout"}
)


class MessageId(Convertor[str]):
    """A message id in a path: 32 hex digits, dashes allowed (api.message_id reads it)."""

    regex = "[0-9a-fA-F-]{32,36}"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class ActionName(Convertor[str]):
    """An action's name in a path (actions.order says which exist): letters only, so a GET of a
    mistyped message id is a 404, not a 405 of the group actions' POST path."""

    regex = "[a-z_]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("message_id", MessageId())
register_url_convertor("action", ActionName())


class Guard:
    """Every request: the Host check (DNS rebinding), then the gate (a read or, for a POST to the
    API, an action), its caller kept in `request.state.caller`; every answer: the security
    headers."""

    def __init__(self, app: ASGIApp, console: Console, *, loopback_only: bool) -> None:
        self.app = app
        self.console = console
        self.busy: dict[str, int] = {}  # requests in progress, by client address
        # On a loopback address, only requests naming a loopback host are served: a web page
        # cannot reach this console by pointing a name of its own at 127.0.0.1.
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        if scope["path"] in PUBLIC:  # the assets and the login: no database, no share to take
            await self.app(scope, _within(receive, BODY_DEADLINE), secured)
            return
        client = scope["client"][0] if scope.get("client") else ""
        if self.busy.get(client, 0) >= PER_CLIENT:
            busy = answer(429, {"error": "too many requests at once from here; try again"},
                          {"Retry-After": "1"})  # fmt: skip
            await busy(scope, receive, secured)
            return
        self.busy[client] = self.busy.get(client, 0) + 1
        try:
            await self.app(scope, _within(receive, BODY_DEADLINE), secured)
        finally:
            self.busy[client] -= 1
            if not self.busy[client]:
                del self.busy[client]

    def _refusal(self, scope: Scope) -> Response | None:
        """The answer when this request may not go on; None when it may."""
        path: str = scope["path"]
        api_call = path.startswith("/api/")
        if self.loopback_only and not _loopback_host(Headers(scope=scope).get("host")):
            return answer(421, {"error": "this console answers to 127.0.0.1 or localhost only"})
        headers = Headers(scope=scope)
        for name in ("Authorization", SESSION_HEADER):
            # Two of a credential: which one counts would be a guess (a planted one, say).
            if len(headers.getlist(name)) > 1:
                return answer(400, {"error": f"{name}: send it once"})
        if path in PUBLIC or scope["method"] not in ("GET", "HEAD", "POST"):
            return None  # the router answers 405 for other methods
        write = scope["method"] == "POST"
        if write and not api_call:
            return None  # no such route: the router answers 404 or 405
        request = Request(scope)
        caller = self.console.gate.check(credentials(request), write=write)
        if isinstance(caller, Denied):
            if api_call or caller.status != 401:
                return _denied(caller)
            # A page opened without a session: its frame, whose script fetches the page again
            # with the session it keeps, or goes to the login form.
            viewer = Viewer(can_act=False, actions_on=self.console.gate.actions_on)
            return HTMLResponse(pages.needs_session(viewer), 401)
        scope.setdefault("state", {})["caller"] = caller
        return None


def _within(receive: Receive, seconds: float) -> Receive:
    """`receive`, with the request's body due within `seconds` (a 408 after): a client sending
    its body a byte at a time holds a request, not a worker, and not for ever."""
    deadline = anyio.current_time() + seconds
    done = False

    async def receive_within() -> Message:
        nonlocal done
        if done:
            return await receive()
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                message = await receive()
        except TimeoutError:
            raise HTTPException(408, "the request's body came too slowly") from None
        done = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return receive_within


def _denied(denied: Denied) -> Response:
    extra = {}
    if denied.status == 401:
        extra["WWW-Authenticate"] = 'Bearer realm="outbox-relay console"'
    if denied.retry_after is not None:
        extra["Retry-After"] = str(denied.retry_after)
    return answer(denied.status, {"error": denied.reason}, extra)


def _loopback_host(header: str | None) -> bool:
    if not header:
        return False
    host = urllib.parse.urlsplit(f"//{header}").hostname or ""
    return is_loopback(host)


def create_app(console: Console, *, loopback_only: bool) -> Starlette:
    """The console's ASGI application."""
    c = console
    routes = [
        Route("/static/console.css", c.css),
        Route("/static/console.js", c.js),
        Route("/favicon.ico", c.favicon),
        Route("/login", c.login_form, methods=["GET"]),
        Route("/login", c.login, methods=["POST"]),
        Route("/logout", c.logout, methods=["POST"]),
        Route("/", c.overview_page),
        Route("/messages", c.messages_page),
        Route("/messages/{id:message_id}", c.message_page),
        Route("/api/overview", c.api_overview),
        Route("/api/messages", c.api_messages),
        Route("/api/groups", c.api_groups),
        Route("/api/circuits/reset", c.reset_circuit, methods=["POST"]),
        Route("/api/messages/{id:message_id}", c.api_message),
        Route("/api/messages/{id:message_id}/{action:action}", c.act_one, methods=["POST"]),
        Route("/api/messages/{action:action}", c.act_many, methods=["POST"]),
    ]

    def problem(status: int) -> Any:
        def handle(request: Request, exc: Exception) -> Response:
            return c.problem(request, status, str(exc))

        return handle

    def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path, method = request.url.path, request.method
        if exc.status_code == 404:
            text = f"no API path {path}" if path.startswith("/api/") else f"no page {path}"
        elif exc.status_code == 405:
            text = f"{method} is not allowed here"
        elif exc.status_code == 413:
            text = "the request body is too large"
        elif exc.status_code == 400:
            text = "the request cannot be read"
        else:
            text = exc.detail
        return c.problem(request, exc.status_code, text)

    def permission(request: Request, exc: Exception) -> Response:
        # A console run as a read-only role (grants --viewer).
        return c.problem(request, 403, f"the console's database role may not do this: {exc}")

    def crashed(request: Request, exc: Exception) -> Response:
        log.error(
            "console.request_failed",
            extra={"method": request.method, "path": request.url.path},
            exc_info=exc,
        )
        return PlainTextResponse(
            "internal error: see the console's log\n", 500, headers=SECURITY_HEADERS
        )

    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, console=c, loopback_only=loopback_only)],
        exception_handlers={
            BadRequest: problem(400),
            DatabaseUnavailable: problem(503),
            SchemaNotFound: problem(503),
            PermissionDenied: permission,
            HTTPException: http_error,
            Exception: crashed,
        },
        max_body_size=MAX_BODY,
    )
