"""The one place where text becomes markup.

Every value put into a template goes through `render`, which escapes it (`html.escape`, quotes
included, and control characters written out as `\\x1b` so none can act on what displays the
page) unless it is already `Html`: the output of `render` itself. Templates are
`string.Template`s (`$name`), always with quoted attributes; nothing in the console builds markup
by concatenating text that a message, a header or an error carries.
"""

from __future__ import annotations

import html
import string
from collections.abc import Iterable

from relay.runtime.logs import printable


class Html(str):
    """Markup: a template's own text with escaped values, safe to send as it is."""

    __slots__ = ()


def escape(value: object) -> Html:
    """`value` as markup: Html as it is, anything else as escaped text (None as '-')."""
    if isinstance(value, Html):
        return value
    shown = "-" if value is None else printable(str(value), keep="\n\t")
    return Html(html.escape(shown, quote=True))


def render(template: str, /, **values: object) -> Html:
    """`template` with each `$name` replaced by `values[name]`, escaped (see `escape`)."""
    return Html(string.Template(template).substitute({k: escape(v) for k, v in values.items()}))


def join(parts: Iterable[object], separator: str = "") -> Html:
    """Markup and text, in order (text escaped): for lists of rows and cells."""
    return Html(separator.join(escape(p) for p in parts))
