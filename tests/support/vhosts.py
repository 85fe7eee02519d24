"""A RabbitMQ vhost of a test's own on the tests' broker, created and deleted with rabbitmqctl,
so that what the test declares (fixed names, such as a topology file's) meets no one else's."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.support.broker import AMQP_URL


def rabbitmqctl(*args: str) -> str:
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    done = subprocess.run(
        [ctl, "-q", *args], check=True, capture_output=True, text=True, timeout=60
    )
    return done.stdout


@contextlib.contextmanager
def own_vhost(prefix: str = "t") -> Iterator[str]:
    """The AMQP URL of a new vhost (guest may do anything there), deleted afterwards."""
    vhost = f"{prefix}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield AMQP_URL.rsplit("/", 1)[0] + "/" + quote(vhost, safe="")
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def vhost_url() -> Iterator[str]:
    with own_vhost() as url:
        yield url


@pytest.fixture(scope="module")
def module_vhost_url() -> Iterator[str]:
    """One vhost for a module's tests (each declares names of its own there): rabbitmqctl takes
    a second or more per call."""
    with own_vhost() as url:
        yield url
