"""outbox.celery_task_message against Celery's own protocol-2 message builder (no broker)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery

import outbox
from outbox.encoding import JSON_TYPE, check_headers, encode_payload
from outbox.errors import InvalidOption


@pytest.fixture(scope="module")
def celery_app() -> Any:
    return Celery("protocol", set_as_current=False)


def test_the_message_is_the_one_celery_builds(celery_app: Any) -> None:
    args, kwargs = [42, "Zoë"], {"notify": True, "lines": [1, 2]}
    ours = outbox.celery_task_message("shop.confirm", args, kwargs, task_id="t-1")
    theirs = celery_app.amqp.as_task_v2("t-1", "shop.confirm", args=tuple(args), kwargs=kwargs)
    # The body, as each one's JSON reads back.
    assert json.loads(encode_payload(ours["payload"], None, 1 << 20).body) == json.loads(
        json.dumps(theirs.body)
    )
    # Every header Celery sets is sent with the same value, except these, left out at their
    # defaults (a missing header is the default to the worker; None and lists are no AMQP
    # header values here) and `origin`, the sending node's name.
    defaults: dict[str, Any] = {
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "parent_id": None,
        "timelimit": [None, None],
        "ignore_result": False,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    assert {name: theirs.headers[name] for name in defaults} == defaults
    left_out = {*defaults, "origin"}
    assert ours["headers"] == {k: v for k, v in theirs.headers.items() if k not in left_out}
    assert ours["content_type"] == JSON_TYPE
    assert (ours["exchange"], ours["routing_key"]) == ("", "celery")


def test_enqueue_accepts_it_as_it_is() -> None:
    message = outbox.celery_task_message("t", ["x" * 5000], {"k": None})
    assert check_headers(message["headers"]) == message["headers"]
    assert encode_payload(message["payload"], message["content_type"], 1 << 20)
    argsrepr = str(message["headers"]["argsrepr"])
    assert len(argsrepr) == 1024  # Celery's own cut
    assert argsrepr.endswith("...")


def test_each_call_is_a_new_task() -> None:
    first, second = outbox.celery_task_message("t"), outbox.celery_task_message("t")
    assert first["headers"]["id"] != second["headers"]["id"]
    assert first["headers"]["root_id"] == first["headers"]["id"]


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        ({"task": ""}, "task must be a registered task name"),
        ({"task": b"t"}, "task must be a registered task name"),
        ({"task": "t", "args": "abc"}, "args must be a list or tuple, not str"),
        ({"task": "t", "args": 5}, "args must be a list or tuple, not int"),
        ({"task": "t", "kwargs": {1: "a"}}, "kwargs must be a mapping with str keys"),
        ({"task": "t", "kwargs": [("a", 1)]}, "kwargs must be a mapping with str keys"),
        ({"task": "t", "task_id": ""}, "task_id must be a non-empty str"),
    ],
)
def test_bad_arguments_name_the_problem(call: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidOption, match=problem):
        outbox.celery_task_message(**call)
