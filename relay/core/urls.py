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
        if (netloc, query) == (parts.netloc, parts.query):
            # Unchanged, so not rebuilt: urlunsplit writes sqlite:///x.db as sqlite:/x.db.
            return raw
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparseable URL>"


def url_secrets(raw: str) -> set[str]:
    """The secrets `raw` holds (its password, and its credential query values), as written and
    percent-decoded, so a message quoting either form can be masked. Values shorter than 3
    characters are left out: masking "a" everywhere would garble the message."""
    try:
        parts = urllib.parse.urlsplit(raw)
        values = [parts.password or ""]
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return set()
    values += [v for name, v in pairs if name.lower() in _SECRET_PARAMS]
    found = {v for v in values if len(v) >= 3}
    return (
        found
        | {urllib.parse.unquote(v) for v in found}
        | {urllib.parse.quote(v, safe="") for v in found}
    )


def secrets_of(*urls: str) -> list[str]:
    """The secrets of every URL, longest first (a shorter one may be part of a longer one)."""
    found: set[str] = set()
    for url in urls:
        found |= url_secrets(url)
    return sorted(found, key=len, reverse=True)
