"""`python manage.py outbox_consume QUEUE --handler dotted.path`: an `outbox.django.Consumer`.

Runs until SIGTERM or SIGINT, then finishes the delivery in hand (the broker takes the others
back) and exits 0. A second signal stops it at once: the block in hand rolls back, and its
message is delivered again. Bad input (a handler that cannot be imported or called with the
message, bad secrets) exits 2 with one line; a broker that cannot be reached, or that drops the
connection, exits 1 with one line (start it again: what was not acknowledged is redelivered).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import signal
from types import FrameType
from typing import Any

from django.conf import settings  # type: ignore[import-untyped]
from django.core.management.base import BaseCommand, CommandError  # type: ignore[import-untyped]
from django.db import DEFAULT_DB_ALIAS, connections  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from outbox.consumer.consumer import BrokerError
from outbox.consumer.policy import ConsumerPolicy
from outbox.django.consumer import Consumer, broker_url
from outbox.errors import OutboxError

USAGE = 2  # bad usage or configuration, as for outbox-relay


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return value


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"a number of days (0: never purge), not {text!r}")
    return value


def _hidden(url: str) -> str:
    """The URL (or URLs) with passwords masked, for a message."""
    return re.sub(r"(://[^:/@,]*:)[^@,]*@", r"\1***@", url)


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Consume QUEUE: run the --handler for each message inside transaction.atomic(), once "
        "per message id (the inbox row commits in the same block). Stops on SIGTERM or SIGINT."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queue", help="the queue to consume (it must exist)")
        parser.add_argument(
            "--handler",
            required=True,
            help="dotted path of handler(message), e.g. billing.handlers.on_order",
        )
        parser.add_argument(
            "--using", default=DEFAULT_DB_ALIAS, help="the database alias (default: default)"
        )
        parser.add_argument(
            "--amqp",
            help="the broker's URL (default: settings.OUTBOX_AMQP_URL, else $OUTBOX_AMQP_URL)",
        )
        parser.add_argument("--name", help="the consumer's name in the inbox (default: QUEUE)")
        parser.add_argument("--prefetch", type=_positive, default=50)
        parser.add_argument(
            "--partitions", type=_positive, help="consume the N partitions QUEUE.0 .. QUEUE.N-1"
        )
        parser.add_argument(
            "--max-attempts",
            type=_positive,
            default=ConsumerPolicy().max_attempts,
            help="handler runs before a failing message is dead-lettered (default: 5)",
        )
        parser.add_argument(
            "--inbox-retention-days",
            type=_days,
            default=7.0,
            help="how long processed ids are kept (default: 7; 0: never purged)",
        )
        parser.add_argument(
            "--signed",
            action="store_true",
            help="dead-letter messages whose signature does not verify with OUTBOX_SIGNING_KEYS "
            "(settings or environment: the relay's secrets)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["handler"]
        try:
            handler = import_string(path)
        except ImportError as exc:
            raise CommandError(f"--handler {path}: {exc}", returncode=USAGE) from None
        using = options["using"]
        if using not in connections:
            raise CommandError(f"--using {using}: no such database in DATABASES", returncode=USAGE)
        retention = options["inbox_retention_days"]
        url = broker_url(options["amqp"])
        try:
            consumer = Consumer(
                options["queue"],
                handler,
                using=using,
                amqp_url=url,
                name=options["name"],
                prefetch=options["prefetch"],
                partitions=options["partitions"],
                policy=ConsumerPolicy(max_attempts=options["max_attempts"]),
                inbox_retention=dt.timedelta(days=retention) if retention else None,
                signing_secrets=self._secrets() if options["signed"] else None,
            )
        except OutboxError as exc:
            raise CommandError(f"--handler {path}: {exc}", returncode=USAGE) from None

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            consumer.stop()
            # A second signal is not caught: it stops the process at once.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stdout.write(f"outbox_consume: consuming {', '.join(consumer.queues)} with {path}")
        try:
            consumer.run()
        except BrokerError as exc:
            raise CommandError(self._broker_failure(exc, consumer.queues, url)) from None
        done: dict[str, int] = {}
        for processor in consumer.processors:
            for outcome, n in processor.counts.items():
                done[outcome] = done.get(outcome, 0) + n
        summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(done.items()))
        self.stdout.write(f"outbox_consume: stopped ({summary or 'nothing consumed'})")

    def _secrets(self) -> str:
        secrets = getattr(settings, "OUTBOX_SIGNING_KEYS", None) or os.environ.get(
            "OUTBOX_SIGNING_KEYS"
        )
        if not secrets:
            raise CommandError(
                "--signed checks signatures with the relay's secrets: set OUTBOX_SIGNING_KEYS "
                "(in settings or the environment)",
                returncode=USAGE,
            )
        return str(secrets)

    @staticmethod
    def _broker_failure(exc: Exception, queues: list[str], url: str) -> str:
        where = _hidden(url)
        if getattr(exc, "reply_code", None) == 404:  # the broker closed the channel: NOT_FOUND
            return (
                f"a queue of {', '.join(queues)} does not exist on the broker at {where}: "
                f"declare it (outbox-relay topology apply FILE) ({exc})"
            )
        detail = str(exc) or type(exc).__name__
        return f"the broker at {where} failed: {type(exc).__name__}: {detail}"
