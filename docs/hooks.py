"""MkDocs hooks: pages whose content is generated from the code at build time.

`<!-- cli-reference -->` on a page becomes the command line's reference, written from the parser
and the settings table (relay.cli.reference), so the page cannot drift from `--help`.
"""

from __future__ import annotations

from typing import Any

from relay.cli import reference

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, reference.markdown())
    return markdown
