"""URLs as they may be shown: in logs, errors and `--help`, never with a password."""

from __future__ import annotations

import urllib.parse

# Query parameters that carry credentials: libpq and psycopg take `?password=`, and TLS options
# may name a key's passphrase.
_SECRET_PARAMS = frozenset({"password", "passwd", "pass", "pwd", "secret", "token", "sslpassword"})


def redact(raw: str) -> str:
    """The URL with every password replaced by `***` (in the userinfo and in the query)."""
    try:
        parts = urllib.parse.urlsplit(raw)
        netloc = parts.netloc
        if parts.password:
            userinfo, _, hostinfo = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostinfo}"
        query = parts.query
        if query:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
            if any(name.lower() in _SECRET_PARAMS for name, _ in pairs):
                query = "&".join(
                    f"{name}=***" if name.lower() in _SECRET_PARAMS else f"{name}={value}"
                    for name, value in pairs
                )
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparseable URL>"
