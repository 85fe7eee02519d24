"""The console's routes: a request in, a response out, every read and every action checked by the
gate first. Pages and the JSON API share the store's queries; nothing here writes SQL.

    GET  /                     overview                GET  /login, POST /login, POST /logout
    GET  /messages?...         the list, with filters  GET  /static/console.css, console.js
    GET  /messages/{id}        one message             /api/...  see api.py
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from relay.console import api, assets, layout, overview, pages
from relay.console.auth import (
    Caller,
    Credentials,
    Denied,
    Gate,
    cookie_header,
    expired_cookie_header,
    is_loopback,
    same_origin,
)
from relay.console.filters import BadRequest, filter_params, parse_query
from relay.console.html import Html
from relay.console.monitor import Monitor
from relay.errors import DatabaseUnavailable, PermissionDenied, RelayError, SchemaNotFound
from relay.runtime.message_rows import jsonable
from relay.store import admin
from relay.store import grants as store_grants
from relay.store.boundary import translated
from relay.store.sql_store import SqlStore

log = logging.getLogger("relay")

MAX_BODY = 1024 * 1024
FIRST_SNAPSHOT_WAIT = 5.0  # seconds a first overview waits for the first figures
_ID = r"([0-9a-fA-F-]{32,36})"
_MESSAGE_PAGE = re.compile(rf"^/messages/{_ID}$")
_MESSAGE_API = re.compile(rf"^/api/messages/{_ID}$")
_ACT_ONE = re.compile(rf"^/api/messages/{_ID}/(\w+)$")
_ACT_MANY = re.compile(r"^/api/messages/(\w+)$")
# Sent with every answer: no framing, no sniffing, no script or style but our own files.
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; "
        "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    # same-origin, not no-referrer: under no-referrer browsers send `Origin: null` with a POST,
    # and the login form's same-origin check could not tell its own page from another site.
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # case-insensitive (the server's email.message.Message)
    body: bytes
    client: str


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: str
    headers: list[tuple[str, str]] = field(default_factory=list)


def _json(status: int, value: Any, *extra: tuple[str, str]) -> Response:
    return Response(status, (json.dumps(value) + "\n").encode(), "application/json", list(extra))


def _html(status: int, markup: Html, *extra: tuple[str, str]) -> Response:
    return Response(status, markup.encode(), "text/html; charset=utf-8", list(extra))


def _see(location: str, *extra: tuple[str, str]) -> Response:
    return Response(303, b"", "text/plain", [("Location", location), *extra])


class Console:
    def __init__(
        self,
        *,
        engine: Engine,
        store: SqlStore,
        gate: Gate,
        monitor: Monitor,
        host: str,
        trace_url: str | None = None,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.engine = engine
        self.store = store
        self.gate = gate
        self.monitor = monitor
        self.trace_url = trace_url
        self._now = now
        # On a loopback address, only requests naming a loopback host are served: a web page
        # cannot reach this console by pointing a name of its own at 127.0.0.1 (DNS rebinding).
        self._loopback_only = is_loopback(host)

    def handle(self, req: Request) -> Response:
        api_call = req.path.startswith("/api/")
        if self._loopback_only and not _loopback_host(req.headers.get("Host")):
            return _json(421, {"error": "this console answers to 127.0.0.1 or localhost only"})
        try:
            with translated(self.engine):
                return self._route(req, api_call)
        except BadRequest as exc:
            return self._problem(req, api_call, 400, str(exc))
        except (DatabaseUnavailable, SchemaNotFound) as exc:
            return self._problem(req, api_call, 503, str(exc))
        except PermissionDenied as exc:  # a console run as a read-only role (grants --viewer)
            return self._problem(
                req, api_call, 403, f"the console's database role may not do this: {exc}"
            )

    def _problem(self, req: Request, api_call: bool, status: int, text: str) -> Response:
        if api_call:
            return _json(status, {"error": text})
        return _html(status, layout.error_page(status, text, self._viewer(req)))

    def _credentials(self, req: Request, csrf: str | None = None) -> Credentials:
        h = req.headers
        return Credentials(
            authorization=h.get("Authorization"),
            cookie=h.get("Cookie"),
            csrf=csrf if csrf is not None else h.get("X-CSRF-Token"),
            origin=h.get("Origin"),
            host=h.get("Host"),
            operator=h.get("X-Outbox-Operator"),
            client=req.client,
        )

    def _viewer(self, req: Request) -> layout.Viewer:
        session = self.gate.session(req.headers.get("Cookie"))
        if session is None:
            return layout.Viewer(can_act=False, actions_on=self.gate.actions_on)
        return layout.Viewer(self.gate.actions_on, self.gate.actions_on, session.name, session.csrf)

    # ----------------------------------------------------------------- routing

    def _route(self, req: Request, api_call: bool) -> Response:
        path, method = req.path, req.method
        if method == "GET" and path in ("/static/console.css", "/static/console.js"):
            css = path.endswith(".css")
            kind = "text/css" if css else "text/javascript"
            return Response(200, (assets.CSS if css else assets.JS).encode(), kind)
        if path == "/favicon.ico":
            return Response(204, b"", "image/x-icon")
        if path == "/login":
            return self._login(req)
        if path == "/logout" and method == "POST":
            return self._logout(req)
        if method == "POST" and api_call:
            return self._write(req)
        if method != "GET":
            return self._problem(req, api_call, 405, f"{method} is not allowed here")
        caller = self.gate.check(self._credentials(req), write=False)
        if isinstance(caller, Denied):
            if api_call:
                return _denied(caller)
            return _see("/login")
        return self._api_read(req) if api_call else self._page(req)

    def _page(self, req: Request) -> Response:
        viewer, now = self._viewer(req), self._now()
        params = parse_query(req.query)
        if req.path == "/":
            snap = self.monitor.snapshot(wait=FIRST_SNAPSHOT_WAIT)
            return _html(200, overview.render_page(snap, self.monitor.error, viewer))
        if req.path == "/messages":
            result = api.page_of(self.engine, params, now)
            groups = api.groups(self.engine, params, now)
            return _html(200, pages.messages(filter_params(params), result, groups, viewer))
        found = _MESSAGE_PAGE.match(req.path)
        if found:
            message = admin.get_message(self.engine, api.message_id(found.group(1)))
            if message is None:
                return self._problem(req, False, 404, f"no message {found.group(1)}")
            return _html(200, pages.message(message, viewer, self.trace_url))
        return self._problem(req, False, 404, f"no page {req.path}")

    def _api_read(self, req: Request) -> Response:
        params, now = parse_query(req.query), self._now()
        if req.path == "/api/overview":
            snap = self.monitor.snapshot(wait=FIRST_SNAPSHOT_WAIT)
            if snap is None:
                return _json(503, {"error": self.monitor.error or "not read yet; try again"})
            return _json(200, api.overview(snap))
        if req.path == "/api/messages":
            return _json(200, api.messages(self.engine, params, now))
        if req.path == "/api/groups":
            found = api.groups(self.engine, params, now)
            return _json(200, {"groups": [] if found is None else jsonable(found)})
        one = _MESSAGE_API.match(req.path)
        if one:
            message = api.one(self.engine, one.group(1), self.trace_url)
            if message is None:
                return _json(404, {"error": f"no message {one.group(1)}"})
            return _json(200, message)
        return _json(404, {"error": f"no API path {req.path}"})

    def _write(self, req: Request) -> Response:
        caller = self.gate.check(self._credentials(req), write=True)
        if isinstance(caller, Denied):
            return _denied(caller)
        body = _json_body(req)
        reset = req.path == "/api/circuits/reset"
        try:
            return self._act(req, body, caller.who, reset)
        except PermissionDenied as exc:  # a console run as a read-only role (grants --viewer)
            need = store_grants.RESET if reset else store_grants.CHANGE
            return _json(403, {"error": self._lacking(exc, need)})

    def _act(self, req: Request, body: dict[str, Any], who: str, reset: bool) -> Response:
        with translated(self.engine):  # here too: a refused privilege is named by the caller
            if reset:
                status, result = api.reset_circuit(self.store, body, who)
                return _json(status, result)
            one, many = _ACT_ONE.match(req.path), _ACT_MANY.match(req.path)
            if one:
                status, result = api.act(
                    self.engine, one.group(2), one.group(1), body, self._now(), who
                )
            elif many:
                status, result = api.act(self.engine, many.group(1), None, body, self._now(), who)
            else:
                return _json(404, {"error": f"no API path {req.path}"})
        return _json(status, result)

    def _lacking(self, exc: PermissionDenied, need: store_grants.Capability) -> str:
        """Which privileges the console's role lacks for an action, as `outbox-relay` says it."""
        try:
            with self.engine.connect() as conn:
                role = store_grants.current_role(conn)
                lacking = store_grants.missing(conn, [need])
        except (RelayError, SQLAlchemyError):
            return f"the console's database role may not do this: {exc}"
        hint = f"`outbox-relay grants --operator {store_grants.quote(role)}` prints the GRANTs"
        if not lacking:
            return f"the console's database role may not do this: {exc} ({hint})"
        return (
            f"the console's database role {role} lacks {store_grants.describe(lacking)}; "
            f"nothing changed. {hint}"
        )

    # ----------------------------------------------------------------- sessions

    def _login(self, req: Request) -> Response:
        viewer = self._viewer(req)
        if req.method == "GET":
            return _html(200, pages.login(viewer))
        if req.method != "POST":
            return self._problem(req, False, 405, f"{req.method} is not allowed here")
        if not same_origin(req.headers.get("Origin"), req.headers.get("Host")):
            return _html(403, pages.login(viewer, "this form was sent from another site"))
        form = _form(req)
        sid = self.gate.login(form.get("token", ""), form.get("name", ""))
        if sid is None:
            log.warning("console.login_refused", extra={"client": req.client})
            return _html(403, pages.login(viewer, "wrong token"))
        return _see("/", ("Set-Cookie", cookie_header(sid)))

    def _logout(self, req: Request) -> Response:
        creds = self._credentials(req, csrf=_form(req).get("csrf", ""))
        caller = self.gate.check(creds, write=True)
        if isinstance(caller, Caller) and caller.session is not None:
            self.gate.logout(req.headers.get("Cookie"))
            return _see("/", ("Set-Cookie", expired_cookie_header()))
        return self._problem(req, False, 403, "log out from the console's own page")


def _denied(denied: Denied) -> Response:
    extra = (
        [("WWW-Authenticate", 'Bearer realm="outbox-relay console"')]
        if denied.status == 401
        else []
    )
    return _json(denied.status, {"error": denied.reason}, *extra)


def _loopback_host(header: str | None) -> bool:
    if not header:
        return False
    host = urllib.parse.urlsplit(f"//{header}").hostname or ""
    return is_loopback(host)


def _form(req: Request) -> dict[str, str]:
    if len(req.body) > MAX_BODY:
        raise BadRequest("the form is too large")
    pairs = urllib.parse.parse_qsl(req.body.decode("utf-8", "replace"), keep_blank_values=True)
    return dict(pairs)


def _json_body(req: Request) -> dict[str, Any]:
    kind = (req.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if req.body and kind != "application/json":
        raise BadRequest("send the body as application/json")
    if not req.body:
        return {}
    try:
        value = json.loads(req.body)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest("the body must be a JSON object")
    return value
