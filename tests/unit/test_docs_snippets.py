"""Every Python example of the README and the docs site is run by a test.

An example is run where it is read: a test takes it by name with `tests.docs_blocks.block` and
executes it against the real services it needs. This checks the bookkeeping: each Python fence
is a named block, and some test names it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_blocks import NAMED, ROOT, pages

PYTHON_FENCE = re.compile(r"^ *```(?:python|py|pycon)\s*$", re.M)
TESTS = ROOT / "tests"


def _tests_source() -> str:
    own = {Path(__file__).resolve(), (TESTS / "docs_blocks.py").resolve()}
    return "\n".join(
        p.read_text(encoding="utf-8") for p in sorted(TESTS.rglob("*.py")) if p.resolve() not in own
    )


def _python_blocks(text: str) -> tuple[list[str], int]:
    """The names of the named Python blocks, and how many Python fences no name encloses."""
    named, covered = [], 0
    for found in NAMED.finditer(text):
        if found.group("lang") in ("python", "py", "pycon"):
            named.append(found.group("name"))
            covered += 1
    return named, len(PYTHON_FENCE.findall(text)) - covered


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_is_named_and_run_by_a_test(path: Path) -> None:
    named, anonymous = _python_blocks(path.read_text(encoding="utf-8"))
    assert anonymous == 0, (
        f"{path.relative_to(ROOT)} has {anonymous} Python block(s) with no <!-- name --> around "
        "them: name each, and run it in a test (tests/docs_blocks.py)"
    )
    source = _tests_source()
    unrun = [name for name in named if f'"{name}"' not in source]
    assert not unrun, f"{path.relative_to(ROOT)}: no test reads the block(s) {unrun}"
