"""The relay's publishes, out of reach of any instrumentation of pika.

A message leaves the relay with the trace context `enqueue` captured (or that of the relay's send
span, its child) in `traceparent`. An instrumentation of pika rewrites that header on publish:
opentelemetry-instrumentation-pika, which `opentelemetry-instrument` and the OpenTelemetry
Operator load, wraps each new channel's `basic_publish` and injects the context of a new root
span over it, so the consumer would land in another trace. So the relay:

- never calls `Channel.basic_publish`: it writes each publish's frames itself
  (relay/amqp/frames.py), so no wrapper of it, on a channel object or on the class, is on the
  path;
- does its pika work (`untraced()`: publishing, and the IO that reads confirms) with
  OpenTelemetry's suppress-instrumentation flag set, which every OpenTelemetry instrumentation
  checks before it records or injects anything, in case one hooks in deeper than
  `basic_publish`. Only there: the relay's database calls on the same thread stay traceable.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from opentelemetry import context
from pika.channel import Channel
from pika.connection import Connection

# The API's key, and the plain string that older instrumentations read (opentelemetry-
# instrumentation's suppress_instrumentation() sets both).
_PLAIN_KEY = "suppress_instrumentation"
_SUPPRESS_KEYS = (getattr(context, "_SUPPRESS_INSTRUMENTATION_KEY", _PLAIN_KEY), _PLAIN_KEY)

# What instrumentations of pika wrap (opentelemetry-instrumentation-pika: Connection.channel).
_WATCHED = ((Connection, "channel"), (Channel, "basic_publish"))


def suppress_instrumentation() -> contextvars.Token[context.Context]:
    """Set the flag in the calling thread's context; the token undoes it (`context.detach`)."""
    ctx = context.get_current()
    for key in _SUPPRESS_KEYS:
        ctx = context.set_value(key, True, ctx)
    return context.attach(ctx)


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """No instrumentation records or injects anything inside."""
    token = suppress_instrumentation()
    try:
        yield
    finally:
        context.detach(token)


def wrapped_pika() -> list[str]:
    """pika's methods that something (an instrumentation) has wrapped, by qualified name."""
    return [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls, name in _WATCHED
        if hasattr(getattr(cls, name), "__wrapped__")
    ]
