"""The escaping Jinja2's autoescape does not do, for the templates (relay/console/templates/).

Every value a template shows goes through `visible` (Jinja2's `finalize`): control and
bidirectional characters written out as `\\x1b` or `\\u202e`, so none can act on what displays
the page, then HTML-escaped. A value in an attribute goes through `attribute` instead: the raw
value, HTML-escaped and nothing else, so a form field or a hidden input sends back exactly the
name enqueue accepted (an exchange with `\\u202e` in it resets and filters as itself).
"""

from __future__ import annotations

import html

from markupsafe import Markup

from relay.runtime.logs import printable


def visible(value: object) -> object:
    """`value` as text: Markup as it is, None as '-', anything else printable and escaped."""
    if isinstance(value, Markup):
        return value
    shown = "-" if value is None else printable(str(value), keep="\n\t")
    return Markup(html.escape(shown, quote=True))  # noqa: S704 - escaped on this line


def attribute(value: object) -> Markup:
    """`value` for an attribute: the raw text, HTML-escaped (quotes included)."""
    return Markup(html.escape("" if value is None else str(value), quote=True))  # noqa: S704
