"""`make test` runs with `--dist loadgroup`, and relies on it: the tests of one xdist_group run on
one worker, one after another (the full-speed drains never beside each other; the wheel built once).
A pytest or pytest-xdist release that stops honouring the mark fails nothing else, so this runs
the installed pair on a module of its own and checks where each test ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MODULE = """
import json, os
from pathlib import Path

import pytest

OUT = Path(__file__).with_name("workers.jsonl")


def record(name: str) -> None:
    with OUT.open("a") as out:
        out.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")


@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i: int) -> None:
    record(f"grouped-{i}")


@pytest.mark.parametrize("i", range(4))
def test_free(i: int) -> None:
    record(f"free-{i}")
"""


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouping.py").write_text(MODULE)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    done = subprocess.run(
        [*command, "-n", "2", "--dist", "loadgroup", str(tmp_path / "test_grouping.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [json.loads(line) for line in (tmp_path / "workers.jsonl").read_text().splitlines()]
    assert len(ran) == 8, ran
    grouped = {worker for name, worker in ran if name.startswith("grouped")}
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}: {ran}"
