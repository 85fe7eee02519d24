"""A Celery task as an outbox message: `enqueue`'s arguments for Celery's task protocol 2.

    outbox.enqueue(session, **outbox.celery_task_message("shop.send_confirmation", args=[42]))

The worker runs the task once the business transaction has committed and the relay published it,
never for a transaction that rolled back. Celery itself is not imported: the protocol is plain
JSON and headers (https://docs.celeryq.dev/en/stable/internals/protocol.html, version 2).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from outbox.errors import InvalidOption

# Celery's own cut for the argsrepr/kwargsrepr headers (what monitoring tools show).
REPR_MAX = 1024


class CeleryTaskMessage(TypedDict):
    """The keyword arguments of `outbox.enqueue` that make a message a Celery task."""

    exchange: str
    routing_key: str
    payload: list[Any]
    headers: dict[str, str | int | float | bool]
    content_type: str


def celery_task_message(
    task: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    exchange: str = "",
    routing_key: str = "celery",
    task_id: str | None = None,
) -> CeleryTaskMessage:
    """`enqueue` arguments that run the registered task `task(*args, **kwargs)` on a worker.

    The message follows Celery's task protocol 2 (a JSON body and the task's headers), so an
    unmodified Celery worker runs it once the transaction has committed and the relay has
    published it, and never for a transaction that rolled back. Celery is not imported.

    Args:
        task: The registered task name, as the worker knows it.
        args: The task's positional arguments; they must encode as JSON.
        kwargs: The task's keyword arguments; they must encode as JSON.
        exchange: The default exchange (`""`) delivers to the queue named by `routing_key`;
            give the exchange your task routes use otherwise.
        routing_key: Celery's default queue is `"celery"`.
        task_id: The id the worker, result backends and monitoring know the task by;
            a random UUID by default.

    Returns:
        `exchange`, `routing_key`, `payload`, `headers` and `content_type`, to pass to
            `outbox.enqueue` (or `enqueue_async`) with `**`, beside any other argument.

    Raises:
        InvalidOption: `task`, `args`, `kwargs` or `task_id` is not of the shape Celery needs.
    """
    if not isinstance(task, str) or not task:
        raise InvalidOption(f"task must be a registered task name (a non-empty str), not {task!r}")
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise InvalidOption(f"args must be a list or tuple, not {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidOption("kwargs must be a mapping with str keys")
    if task_id is None:
        task_id = str(uuid.uuid4())
    elif not isinstance(task_id, str) or not task_id:
        raise InvalidOption(f"task_id must be a non-empty str, not {task_id!r}")
    # Protocol 2: the body is [args, kwargs, embed]; the headers carry what the worker routes on.
    # Headers whose value would be None (eta, expires, group, parent_id, ...) or a list
    # (timelimit) are left out: AMQP headers here are scalars, and the worker treats a missing
    # header as its default.
    return {
        "exchange": exchange,
        "routing_key": routing_key,
        "payload": [
            list(args),
            dict(kwargs),
            {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
        ],
        "headers": {
            "lang": "py",
            "task": task,
            "id": task_id,
            "root_id": task_id,
            "retries": 0,
            "argsrepr": _cut(repr(tuple(args))),
            "kwargsrepr": _cut(repr(dict(kwargs))),
        },
        "content_type": "application/json",
    }


def _cut(text: str) -> str:
    return text if len(text) <= REPR_MAX else text[: REPR_MAX - 3] + "..."
