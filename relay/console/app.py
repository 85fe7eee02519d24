"""The console's endpoints: a Starlette request in, a response out. The gate (web.py's Guard) has
checked every read and every action first; pages and the JSON API share the store's queries, run
in Starlette's thread pool; nothing here writes SQL.

    GET  /                     overview                GET  /login, POST /login, POST /logout
    GET  /messages?...         the list, with filters  GET  /static/console.css, console.js
    GET  /messages/{id}        one message             /api/...  see api.py
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from outbox.dberrors import sqlstate_of
from relay.console import api, assets, layout, overview, pages
from relay.console.auth import SESSION_HEADER, Caller, Credentials, Denied, Gate, same_origin
from relay.console.filters import BadRequest, Params, filter_params, parse_query
from relay.console.monitor import Monitor
from relay.errors import DatabaseUnavailable, PermissionDenied, RelayError
from relay.runtime.message_rows import jsonable
from relay.store import admin
from relay.store import grants as store_grants
from relay.store.boundary import translated
from relay.store.sql_store import SqlStore

log = logging.getLogger("relay")

FIRST_SNAPSHOT_WAIT = 5.0  # seconds a first overview waits for the first figures
T = TypeVar("T")


def answer(status: int, value: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(value, status, headers)


class Console:
    """The console's state (database, gate, monitor) and its endpoints."""

    def __init__(
        self,
        *,
        engine: Engine,
        scans: Engine,
        scan_timeout: float,
        store: SqlStore,
        gate: Gate,
        monitor: Monitor,
        trace_url: str | None = None,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.engine = engine
        self.scans = scans  # for unbounded scans (api.unbounded_scan)
        self.scan_timeout = scan_timeout
        self.store = store
        self.gate = gate
        self.monitor = monitor
        self.trace_url = trace_url
        self._now = now

    async def _db(self, work: Callable[[], T]) -> T:
        """`work` in the thread pool, its driver errors translated."""

        def run() -> T:
            with translated(self.engine):
                return work()

        return await run_in_threadpool(run)

    async def _read(self, params: Params, work: Callable[[Engine], T]) -> T:
        """`work` on the engine `params` call for: an unbounded scan on the scan engine, whose
        statement timeout is the operator's cue to narrow the filter (a 400, not an outage)."""
        scan = api.unbounded_scan(params)
        engine = self.scans if scan else self.engine
        try:
            return await self._db(lambda: work(engine))
        except DatabaseUnavailable as exc:
            cause = exc.__cause__
            cancelled = isinstance(cause, DBAPIError) and sqlstate_of(cause.orig) == "57014"
            if scan is not None and cancelled:
                raise api.scan_too_long(scan, self.scan_timeout) from None
            raise

    def viewer(self, request: Request) -> layout.Viewer:
        caller = getattr(request.state, "caller", None)
        session = caller.session if isinstance(caller, Caller) else None
        if session is None:
            return layout.Viewer(can_act=False, actions_on=self.gate.actions_on)
        return layout.Viewer(self.gate.actions_on, self.gate.actions_on, session.name)

    # ----------------------------------------------------------------- static

    async def css(self, request: Request) -> Response:
        return Response(assets.CSS, media_type="text/css")

    async def js(self, request: Request) -> Response:
        return Response(assets.JS, media_type="text/javascript")

    async def favicon(self, request: Request) -> Response:
        return Response(status_code=204, media_type="image/x-icon")

    # ----------------------------------------------------------------- pages

    async def overview_page(self, request: Request) -> Response:
        viewer = self.viewer(request)
        snap = await run_in_threadpool(self.monitor.snapshot, FIRST_SNAPSHOT_WAIT)
        return HTMLResponse(overview.render_page(snap, self.monitor.error, viewer))

    async def messages_page(self, request: Request) -> Response:
        viewer, now = self.viewer(request), self._now()
        params = parse_query(request.url.query)

        def read(engine: Engine) -> str:
            result = api.page_of(engine, params, now)
            groups = api.groups(engine, params, now)
            return pages.messages(filter_params(params), result, groups, viewer)

        return HTMLResponse(await self._read(params, read))

    async def message_page(self, request: Request) -> Response:
        raw = request.path_params["id"]
        found = await self._db(lambda: admin.get_message(self.engine, api.message_id(raw)))
        if found is None:
            return self.problem(request, 404, f"no message {raw}")
        return HTMLResponse(pages.message(found, self.viewer(request), self.trace_url))

    def problem(self, request: Request, status: int, text: str) -> Response:
        if request.url.path.startswith("/api/"):
            return answer(status, {"error": text})
        return HTMLResponse(layout.error_page(status, text, self.viewer(request)), status)

    # ----------------------------------------------------------------- API reads

    async def api_overview(self, request: Request) -> Response:
        snap = await run_in_threadpool(self.monitor.snapshot, FIRST_SNAPSHOT_WAIT)
        if snap is None:
            return answer(503, {"error": self.monitor.error or "not read yet; try again"})
        return answer(200, api.overview(snap))

    async def api_messages(self, request: Request) -> Response:
        params, now = parse_query(request.url.query), self._now()
        return answer(200, await self._read(params, lambda e: api.messages(e, params, now)))

    async def api_groups(self, request: Request) -> Response:
        params, now = parse_query(request.url.query), self._now()
        found = await self._read(params, lambda e: api.groups(e, params, now))
        return answer(200, {"groups": [] if found is None else jsonable(found)})

    async def api_message(self, request: Request) -> Response:
        raw = request.path_params["id"]
        found = await self._db(lambda: api.one(self.engine, raw, self.trace_url))
        if found is None:
            return answer(404, {"error": f"no message {raw}"})
        return answer(200, found)

    # ----------------------------------------------------------------- actions

    async def act_one(self, request: Request) -> Response:
        raw, name = request.path_params["id"], request.path_params["action"]
        return await self._act(request, lambda body, who: api.act(
            self.engine, name, raw, body, self._now(), who))  # fmt: skip

    async def act_many(self, request: Request) -> Response:
        name = request.path_params["action"]
        return await self._act(request, lambda body, who: api.act(
            self.engine, name, None, body, self._now(), who))  # fmt: skip

    async def reset_circuit(self, request: Request) -> Response:
        return await self._act(
            request, lambda body, who: api.reset_circuit(self.store, body, who), store_grants.RESET
        )

    async def _act(
        self,
        request: Request,
        action: Callable[[dict[str, Any], str], tuple[int, dict[str, Any]]],
        need: store_grants.Capability = store_grants.CHANGE,
    ) -> Response:
        caller: Caller = request.state.caller
        body = await json_body(request)
        try:
            status, result = await self._db(lambda: action(body, caller.who))
        except PermissionDenied as exc:  # a console run as a read-only role (grants --viewer)
            return answer(403, {"error": await run_in_threadpool(self._lacking, exc, need)})
        return answer(status, result)

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

    async def login_form(self, request: Request) -> Response:
        return HTMLResponse(pages.login(self.viewer(request)))

    async def login(self, request: Request) -> Response:
        viewer = self.viewer(request)
        if not same_origin(request.headers.get("Origin"), request.headers.get("Host")):
            return HTMLResponse(pages.login(viewer, "this form was sent from another site"), 403)
        form = await request.form()
        token, name = form.get("token", ""), form.get("name", "")
        client = request.client.host if request.client else ""
        sid = self.gate.login(str(token), str(name), client)
        if isinstance(sid, Denied):
            log.warning("console.login_refused", extra={"client": client})
            headers = {"Retry-After": str(sid.retry_after)} if sid.retry_after else None
            return HTMLResponse(pages.login(viewer, sid.reason), sid.status, headers)
        # The page keeps the session and sends it as a header (auth.py says why not a cookie).
        return HTMLResponse(pages.signed_in(viewer, sid))

    async def logout(self, request: Request) -> Response:
        caller = self.gate.check(credentials(request), write=True)
        if isinstance(caller, Caller) and caller.session is not None:
            self.gate.logout(request.headers.get(SESSION_HEADER))
            return answer(200, {"summary": "Logged out."})
        return self.problem(request, 403, "log out from the console's own page")


def credentials(request: Request) -> Credentials:
    """What a request presents to the gate."""
    h = request.headers
    return Credentials(
        authorization=h.get("Authorization"),
        session=h.get(SESSION_HEADER),
        origin=h.get("Origin"),
        host=h.get("Host"),
        operator=h.get("X-Outbox-Operator"),
        client=request.client.host if request.client else "",
    )


async def json_body(request: Request) -> dict[str, Any]:
    """The JSON object a POST carries ({} for none), read by Starlette (chunked too)."""
    raw = await request.body()
    kind = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if raw and kind != "application/json":
        raise BadRequest("send the body as application/json")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest("the body must be a JSON object")
    return value
