"""What each install brings: `pip install outbox-relay` the library alone, and an extra per role;
the `outbox-relay` command names the extra it lacks in one line, before importing what needs it
(tests/e2e/test_extras.py installs the wheel for real)."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest

from relay.cli import entry
from relay.errors import ConfigError
from relay.store import databases

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_library_alone_needs_sqlalchemy_and_the_opentelemetry_api() -> None:
    assert names(PROJECT["dependencies"]) == {"sqlalchemy", "opentelemetry-api"}


def test_each_role_has_its_extra() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(extras) == {"relay", "postgresql", "binary", "mysql", "async", "console"}
    assert {"pika", "tenacity", "opentelemetry-sdk", "tqdm"} <= names(extras["relay"])
    assert names(extras["postgresql"]) == {"psycopg"}
    assert extras["binary"] == ["psycopg[binary]>=3.1,<4"]


def test_make_test_and_the_image_install_the_extras_they_run() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (line,) = re.findall(r"^EXTRAS := (.*)$", makefile, re.M)
    assert set(line.split(",")) == set(PROJECT["optional-dependencies"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "'.[relay,binary,mysql,console]'" in dockerfile


def test_the_readme_links_into_the_docs_site() -> None:
    """The README is the package index's page too, where a link to a file of the repository
    leads nowhere."""
    readme = (ROOT / "README.md").read_text()
    inline = re.findall(r"\]\(([^)]+)\)", readme)
    defined = re.findall(r"^\[[^\]]+\]:\s*(\S+)$", readme, re.M)
    assert defined
    assert [link for link in inline + defined if not link.startswith("https://")] == []
    docs = PROJECT["urls"]["Documentation"]
    for page in ("guides/payloads/", "guides/django/", "guides/signing/"):
        assert f"{docs}{page}" in defined, page
    for url in defined:
        if url.startswith(docs):
            page = url.removeprefix(docs).rstrip("/") or "index"
            assert (ROOT / "docs" / f"{page}.md").is_file(), url


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ([], []),
        (['pika<2,>=1.3; extra == "relay"', "sqlalchemy<3,>=2.0"], ["pika"]),
        (["tqdm>=4.66 ; extra == 'relay'", 'jinja2>=3.1; extra == "console"'], ["tqdm"]),
        (['psycopg[binary]<4,>=3.1; extra == "binary"'], []),
    ],
)
def test_an_extra_s_requirements_are_read_from_the_metadata(
    monkeypatch: pytest.MonkeyPatch, listed: list[str], expected: list[str]
) -> None:
    monkeypatch.setattr(entry, "requires", lambda _name: listed)
    assert entry.extra_requirements("relay") == expected


def lacking(monkeypatch: pytest.MonkeyPatch, extra: str, *absent: str) -> None:
    monkeypatch.setattr(entry, "missing", lambda name: list(absent) if name == extra else [])


def test_without_the_relay_extra_a_command_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lacking(monkeypatch, "relay", "pika", "tenacity")
    assert entry.main(["run"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "outbox-relay: this command needs the relay extra: pip install 'outbox-relay[relay]' "
        "(pika and 1 more are not installed)\n"
    )


def test_without_the_relay_extra_the_version_is_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lacking(monkeypatch, "relay", "pika")
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out == entry.version_line() + "\n"


def test_without_the_console_extra_the_console_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lacking(monkeypatch, "console", "starlette")
    assert entry.main(["--db", "sqlite://", "console", "--open-reads"]) == 2
    assert capsys.readouterr().err == (
        "outbox-relay: console needs the console extra: pip install 'outbox-relay[console]' "
        "(starlette is not installed)\n"
    )
    # The other commands do not need it.
    assert entry.main(["--db", "sqlite://", "sql"]) == 0


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (ModuleNotFoundError("No module named 'psycopg'", name="psycopg"), "is not installed"),
        (ImportError("no pq wrapper available"), "cannot load libpq"),
    ],
)
def test_a_postgresql_url_without_a_usable_psycopg_names_the_extras(
    monkeypatch: pytest.MonkeyPatch, failure: ImportError, says: str
) -> None:
    def unimportable(name: str) -> object:
        raise failure

    monkeypatch.setattr(importlib, "import_module", unimportable)
    with pytest.raises(ConfigError) as raised:
        databases.require_driver("psycopg")
    assert says in str(raised.value)
    assert "pip install 'outbox-relay[binary]'" in str(raised.value)
    if says == "is not installed":
        assert "'outbox-relay[postgresql]'" in str(raised.value)
