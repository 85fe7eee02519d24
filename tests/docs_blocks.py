"""Code blocks of the README and the documentation site, as the tests that run them read them.

A block a test runs sits between two HTML comments that name it, which Markdown renders as
nothing:

    <!-- fastapi-example -->
    ```python
    ...
    ```
    <!-- /fastapi-example -->

`tests/unit/test_docs_snippets.py` checks that every Python block of the README and the docs is
named this way and that a test reads it by that name, so no example goes unrun.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# A named block: its fence may be indented (inside a list item) and its language is any word.
NAMED = re.compile(
    r"^<!-- (?P<name>[\w.-]+) -->\n"
    r"(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<code>.*?)^(?P=indent)```\n"
    r"<!-- /(?P=name) -->",
    re.S | re.M,
)


def page(path: str) -> Path:
    """A page of the docs site by its path under docs/ ("guides/alembic.md"), or "README.md"."""
    return README if path == "README.md" else DOCS / path


def block(path: str, name: str) -> str:
    """The code of the block named `name` on the page `path`, dedented as a file would hold it."""
    text = page(path).read_text(encoding="utf-8")
    found = [m for m in NAMED.finditer(text) if m.group("name") == name]
    assert len(found) == 1, f"{path} should hold one block named {name!r}, holds {len(found)}"
    indent = len(found[0].group("indent"))
    lines = found[0].group("code").splitlines()
    return "".join(line[indent:] + "\n" for line in lines)


def named_blocks(text: str) -> dict[str, str]:
    """Every named block of a page's text: name -> language."""
    return {m.group("name"): m.group("lang") for m in NAMED.finditer(text)}


def pages() -> list[Path]:
    """The README and every Markdown page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]
