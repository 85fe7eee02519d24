"""The operator console: `outbox-relay console`, server-rendered pages and the JSON API they use.

    server.py    uvicorn, in a thread, and its bounds (connections, request heads, keep-alive)
    web.py       the Starlette application: routes, the Guard (host check, gate, headers), errors
    app.py       the endpoints: pages, API reads, actions, login and logout
    auth.py      who may read and who may act: the token, login sessions, Origin; throttle.py
                 the rate limit on wrong tokens and the token strength check
    api.py       the JSON API: messages, one message, failure groups, actions, circuits
    actions.py   replay, discard, cancel, reschedule, priority: parsing, dry runs, summaries
    filters.py   query parameters to the store's MessageFilter, and back to links
    monitor.py   the overview's figures, refreshed on demand, and their per-minute rollup
    pages.py     the pages' values (overview.py the overview's), laid out by templates/*.html
    layout.py    the Jinja2 templates and who is looking; charts.py inline SVG's numbers
    html.py      the escaping Jinja2 does not do (control and bidirectional characters)
    present.py   messages and circuits as JSON, payloads as text, JSON or hex

Filters are read, and rows written, as the command line reads and writes them
(relay/runtime/message_filter.py, relay/runtime/message_rows.py).

Every query is the store's (relay/store/admin.py); this package only reads requests and writes
pages.
"""
