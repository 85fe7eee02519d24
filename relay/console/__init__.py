"""The operator console: `outbox-relay console`, server-rendered pages and the JSON API they use.

    server.py    the HTTP server (standard library) and its routes
    auth.py      who may read and who may act: the token, login sessions, CSRF
    api.py       the JSON API: messages, one message, failure groups, actions, circuits
    actions.py   replay, discard, cancel, reschedule, priority: parsing, dry runs, summaries
    filters.py   query parameters to the store's MessageFilter, and back to links
    monitor.py   the overview's figures, refreshed on demand, and their per-minute rollup
    pages.py     the pages; layout.py their frame; charts.py inline SVG; html.py the escaping
    present.py   messages and circuits as JSON, payloads as text, JSON or hex

Filters are read, and rows written, as the command line reads and writes them
(relay/runtime/message_filter.py, relay/runtime/message_rows.py).

Every query is the store's (relay/store/admin.py); this package only reads requests and writes
pages.
"""
