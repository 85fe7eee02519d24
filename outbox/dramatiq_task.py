"""A Dramatiq actor's message as an outbox message: `enqueue`'s arguments for Dramatiq's
RabbitMQ broker.

    outbox.enqueue(session, **outbox.dramatiq_message(send_confirmation, 42, notify=True))

The worker runs the actor once the business transaction has committed and the relay published
it, never for a transaction that rolled back. Dramatiq itself is not imported: its message is one
JSON object (`dramatiq.Message`'s fields, as `dramatiq.encoder.JSONEncoder` writes them),
published by its RabbitMQ broker through the default exchange to the queue of the actor's
`queue_name`, or to that queue's delay queue `<queue>.DQ` with an `eta` option when delayed.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from outbox.errors import InvalidOption

# Dramatiq's own rule for queue names (dramatiq.actor._queue_name_re).
QUEUE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9._-]*")
DEFAULT_QUEUE = "default"
# Options the broker or the worker sets itself, which a message cannot carry through the outbox.
_REFUSED = {
    "broker_priority": "the relay does not publish an AMQP priority; enqueue's priority= "
    "orders the outbox's own queue",
    "eta": "give delay= instead",
}
_CALLBACKS = ("on_success", "on_failure", "on_retry_exhausted")


class DramatiqMessage(TypedDict):
    """The keyword arguments of `outbox.enqueue` that make a message a Dramatiq actor's."""

    exchange: str
    routing_key: str
    payload: dict[str, Any]
    content_type: str


def dramatiq_message(actor: Any, /, *args: Any, **kwargs: Any) -> DramatiqMessage:
    """`enqueue` arguments that run `actor(*args, **kwargs)` on a Dramatiq worker: the outbox's
    `actor.send(*args, **kwargs)`.

    The message is the one Dramatiq's `RabbitmqBroker` would publish, so an unmodified worker
    consuming the actor's queue runs it once the transaction has committed and the relay has
    published it, and never for a transaction that rolled back. Dramatiq is not imported.

    Args:
        actor: A Dramatiq actor (its `actor_name` and `queue_name` are read), or the name of an
            actor on the `"default"` queue.
        *args: The actor's positional arguments. They are encoded as JSON payloads are, so
            `datetime`, `UUID`, `Decimal`, ... arrive as the strings `enqueue` makes of them.
        **kwargs: The actor's keyword arguments, likewise.

    Returns:
        `exchange`, `routing_key`, `payload` and `content_type`, to pass to `outbox.enqueue`
            (or `enqueue_async`) with `**`, beside any other argument.

    Raises:
        InvalidOption: `actor` is neither an actor nor a non-empty name.
    """
    return dramatiq_message_with_options(actor, args=args, kwargs=kwargs)


def dramatiq_message_with_options(
    actor: Any,
    /,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    delay: int | dt.timedelta | None = None,
    queue_name: str | None = None,
    message_id: str | None = None,
    **options: Any,
) -> DramatiqMessage:
    """`dramatiq_message` with Dramatiq's message options: the outbox's
    `actor.send_with_options(args=..., kwargs=..., delay=..., **options)`.

    Args:
        actor: A Dramatiq actor, or an actor's name.
        args: The actor's positional arguments.
        kwargs: The actor's keyword arguments.
        delay: As Dramatiq's: milliseconds, or a `timedelta`. The message goes to the queue's
            delay queue (`<queue>.DQ`) with an `eta` that long after this call, and the worker
            holds it until then. `enqueue(delay=...)` (seconds) keeps it in the outbox instead.
        queue_name: The queue to send to; by default the actor's, or `"default"` for a name.
        message_id: Dramatiq's message id (what its results and logs know the message by);
            a random UUID by default.
        **options: Options for the worker's middleware (`max_retries`, `time_limit`,
            `on_success`, ...), as Dramatiq's own; an actor given as a callback is sent by name.
            They must encode as JSON.

    Returns:
        `exchange`, `routing_key`, `payload` and `content_type`, to pass to `outbox.enqueue`.

    Raises:
        InvalidOption: An argument is not of the shape Dramatiq needs, or an option cannot
            travel through the outbox (`broker_priority`, `eta`).
    """
    actor_name, actor_queue = _actor(actor)
    queue = actor_queue if queue_name is None else queue_name
    if (
        not isinstance(queue, str)
        or not QUEUE_NAME.fullmatch(queue)
        or queue[-3:] in (".DQ", ".XQ")
    ):
        raise InvalidOption(
            f"queue_name must be a Dramatiq queue name (letters, digits, '.', '_' and '-', "
            f"not ending in .DQ or .XQ), not {queue!r}"
        )
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise InvalidOption(f"args must be a list or tuple, not {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidOption("kwargs must be a mapping with str keys")
    if message_id is None:
        message_id = str(uuid.uuid4())
    elif not isinstance(message_id, str) or not message_id:
        raise InvalidOption(f"message_id must be a non-empty str, not {message_id!r}")
    sent_options = _options(options)
    now_ms = int(time.time() * 1000)  # Dramatiq's message_timestamp: when it was sent
    routing_key = queue
    wait = _delay_ms(delay)
    if wait is not None:
        # As RabbitmqBroker.enqueue does: the delay queue, and when the worker may run it.
        routing_key = f"{queue}.DQ"
        sent_options["eta"] = now_ms + wait
    return {
        "exchange": "",
        "routing_key": routing_key,
        "payload": {
            "queue_name": routing_key,
            "actor_name": actor_name,
            "args": list(args),
            "kwargs": dict(kwargs),
            "options": sent_options,
            "message_id": message_id,
            "message_timestamp": now_ms,
        },
        "content_type": "application/json",
    }


def _actor(actor: object) -> tuple[str, str]:
    """The actor's name and queue: read from a Dramatiq actor, or a name on the default queue."""
    name: object = actor
    queue: object = DEFAULT_QUEUE
    if not isinstance(actor, str):
        name = getattr(actor, "actor_name", None)
        queue = getattr(actor, "queue_name", None)
        if not isinstance(name, str) or not isinstance(queue, str):
            raise InvalidOption(
                "actor must be a Dramatiq actor (with actor_name and queue_name) or an actor's "
                f"name, not {type(actor).__name__}"
            )
    if not isinstance(name, str) or not name or not isinstance(queue, str):
        raise InvalidOption("actor must be a Dramatiq actor or a non-empty actor name")
    return name, queue


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    sent: dict[str, Any] = {}
    for name, value in options.items():
        if name in _REFUSED:
            raise InvalidOption(
                f"option {name!r} cannot be sent through the outbox: {_REFUSED[name]}"
            )
        if name in _CALLBACKS and not isinstance(value, str | None):
            # An actor as a callback: Dramatiq sends its name (Actor.message_with_options).
            callback = getattr(value, "actor_name", None)
            if not isinstance(callback, str):
                kind = type(value).__name__
                raise InvalidOption(
                    f"option {name!r} must be an actor or an actor's name, not {kind}"
                )
            value = callback
        sent[name] = value
    return sent


def _delay_ms(delay: object) -> int | None:
    if delay is None:
        return None
    if isinstance(delay, dt.timedelta):
        # As Actor.send_with_options converts it.
        delay = int(delay.total_seconds() * 1000)
    elif isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay):
        raise InvalidOption(
            f"delay must be milliseconds (as Dramatiq's) or a timedelta, not {delay!r}"
        )
    if delay < 0:
        raise InvalidOption(f"delay must not be negative, got {delay}")
    return int(delay)
