"""What `import outbox` loads, and who changes pika's header codec: each in a fresh interpreter,
since this test process has long since imported pika and the relay."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import outbox


def run_fresh(code: str) -> object:
    """Run `code` in a new interpreter; return what it printed as JSON on its last line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


LOADED = """
import json, sys
print(json.dumps(sorted(
    m for m in sys.modules if m.split(".")[0] in ("pika", "relay", "django")
    or m == "outbox.borrowed"
)))
"""


@pytest.mark.parametrize(
    "code",
    [
        "import outbox",
        "import outbox; outbox.enqueue; outbox.create_schema; outbox.OutboxError",
        "import outbox; outbox.testing.enqueued; outbox.State; outbox.configure",
        "import outbox.dberrors, outbox.encoding, outbox.schema, outbox.migrate",
    ],
)
def test_enqueuing_loads_neither_pika_nor_the_relay(code: str) -> None:
    assert run_fresh(code + "\n" + LOADED) == []


def test_the_consumer_names_load_pika_on_first_use_and_never_the_relay() -> None:
    loaded = run_fresh("import outbox; outbox.Consumer; outbox.process_once\n" + LOADED)
    assert isinstance(loaded, list)
    assert "pika" in loaded
    assert not [m for m in loaded if m.split(".")[0] == "relay"]


def test_every_public_name_resolves() -> None:
    for name in outbox.__all__:
        assert getattr(outbox, name) is not None
    assert {"Consumer", "Processor", "testing"} <= set(dir(outbox))
    assert outbox.Consumer is outbox.consumer.Consumer
    with pytest.raises(AttributeError, match="no attribute 'Consumr'"):
        _ = outbox.Consumr


CODEC = """
import json, pika.data
stock = (pika.data.encode_value, pika.data.decode_value, pika.data.encode_table)

def untouched():
    return (pika.data.encode_value, pika.data.decode_value, pika.data.encode_table) == stock
"""


def test_importing_outbox_and_the_relay_publisher_leaves_pikas_codec_alone() -> None:
    code = (
        CODEC
        + """
import outbox, outbox.consumer, outbox.testing
import relay.amqp.publisher, relay.amqp.wire
relay.amqp.publisher.Publisher("amqp://guest:guest@127.0.0.1:5672/%2F")  # built, not started
print(json.dumps(untouched()))
"""
    )
    assert run_fresh(code) is True


def test_building_a_consumer_makes_pika_decode_floats_and_nothing_else() -> None:
    code = (
        CODEC
        + """
from sqlalchemy import create_engine
import outbox
before = untouched()
outbox.Consumer(create_engine("sqlite://"), "amqp://localhost", "q", lambda s, m: None)
from outbox.amqp_codec import decode_value
print(json.dumps([before, pika.data.decode_value is decode_value,
                  pika.data.encode_value is stock[0], pika.data.encode_table is stock[2]]))
"""
    )
    assert run_fresh(code) == [True, True, True, True]
