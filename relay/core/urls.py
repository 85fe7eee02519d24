"""URLs as they may be shown: in logs, errors and `--help`, never with a password; and lists of
URLs (the nodes of one RabbitMQ cluster, comma-separated)."""

from __future__ import annotations

import re
import urllib.parse

# Query parameters that carry credentials: libpq and psycopg take `?password=`, and TLS options
# may name a key's passphrase.
_SECRET_PARAMS = frozenset({"password", "passwd", "pass", "pwd", "secret", "token", "sslpassword"})


# What starts a URL: a comma followed by one starts the next URL of a list. A comma followed by
# anything else belongs to the URL before it (a dict literal in a query, a path).
_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


def split_urls(raw: str) -> list[str]:
    """The URLs of a comma-separated list, in order (one URL is a list of one). Empty items
    (a trailing comma) are left out; a comma not followed by a scheme stays in its URL."""
    urls: list[str] = []
    for item in raw.split(","):
        if urls and not _SCHEME.match(item):
            if item.strip():
                urls[-1] += "," + item
            continue
        if item.strip():
            urls.append(item.strip())
    return urls


def node_name(url: str) -> str:
    """host:port of an AMQP URL (the default port of its scheme when none is written): how logs
    and /readyz name the node of a cluster the relay uses. The URL was validated already."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def redact(raw: str) -> str:
    """The URL with every password replaced by `***` (in the userinfo and in the query); each
    URL of a comma-separated list."""
    urls = split_urls(raw)
    if len(urls) > 1:
        return ",".join(_redact(url) for url in urls)
    return _redact(raw)


def _redact(raw: str) -> str:
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
    percent-decoded, so a message quoting either form can be masked; those of every URL of a
    comma-separated list. Values shorter than 3 characters are left out: masking "a"
    everywhere would garble the message."""
    urls = split_urls(raw)
    if len(urls) > 1:
        return set().union(*(_url_secrets(url) for url in urls))
    return _url_secrets(raw)


def _url_secrets(raw: str) -> set[str]:
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
