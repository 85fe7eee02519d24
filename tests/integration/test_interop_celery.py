"""A real Celery worker runs a task dispatched through the outbox with the docs' snippet
(docs/guides/consumers.md, block "celery-example").

The worker is Celery's own embedded one (`celery.contrib.testing.worker.start_worker`: a real
WorkController, solo pool, in a thread), consuming a queue of this module's own; remote control
and events are off, so it declares nothing else on the broker.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from tests.docs_blocks import block
from tests.support.broker import amqp_connection
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclasses.dataclass
class Worker:
    queue: str
    ran: list[dict[str, Any]]  # one entry per task run: its arguments and request


@pytest.fixture(scope="module")
def module_worker(amqp_url: str) -> Iterator[Worker]:
    queue = f"t.{uuid.uuid4().hex[:12]}"
    app = Celery(f"interop-{queue}", broker=amqp_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,  # the worker declares it (and a direct exchange of that name)
        worker_enable_remote_control=False,  # no shared pidbox exchange
        worker_send_task_events=False,
        worker_hijack_root_logger=False,  # pytest keeps its log capture
        broker_connection_retry_on_startup=True,
    )
    ran: list[dict[str, Any]] = []

    @app.task(name="shop.send_confirmation", bind=True)  # type: ignore[untyped-decorator]
    def send_confirmation(self: Any, order_id: int, notify: bool = False) -> None:
        request = self.request
        ran.append(
            {
                "args": (order_id, notify),
                "id": request.id,
                "routing_key": request.delivery_info["routing_key"],
                "exchange": request.delivery_info["exchange"],
            }
        )

    try:
        with start_worker(app, perform_ping_check=False, loglevel="WARNING") as worker:
            yield Worker(queue, ran)
            # The worker's event loop looks at its stop flag only when it wakes (up to 10 s
            # apart when idle): set the flag Celery's fixture sets, then wake the loop.
            worker_state.should_terminate = 0
            worker.hub.call_soon(lambda: None)
    finally:
        conn = amqp_connection()
        try:
            channel = conn.channel()
            channel.queue_delete(queue)
            channel.exchange_delete(queue)
        finally:
            conn.close()


@pytest.fixture
def celery_worker(module_worker: Worker) -> Worker:
    """The module's worker, with no task run yet as far as this test is concerned."""
    module_worker.ran.clear()
    return module_worker


def test_a_celery_worker_runs_the_task_the_docs_snippet_enqueued(
    pg_url: str, pg_engine: Engine, relay_factory: RelayFactory, celery_worker: Worker
) -> None:
    namespace: dict[str, Any] = {}
    code = block("guides/consumers.md", "celery-example")
    exec(compile(code, "docs/guides/consumers.md (celery-example)", "exec"), namespace)
    namespace["place_order"](pg_engine, 42, queue=celery_worker.queue)
    relay_factory(pg_url)

    (ran,) = wait_until(lambda: celery_worker.ran, timeout=15, what="the task to run")
    assert ran["args"] == (42, True)
    assert (ran["exchange"], ran["routing_key"]) == ("", celery_worker.queue)
    assert uuid.UUID(ran["id"])  # the helper's fresh task id
    wait_until(lambda: states(pg_engine) == {"published": 1}, what="the row marked published")


def test_a_task_id_and_a_named_exchange_reach_the_worker(
    pg_url: str, pg_engine: Engine, relay_factory: RelayFactory, celery_worker: Worker
) -> None:
    """Routed as Celery routes it itself (the queue's direct exchange), with a chosen task id
    and keyword arguments only."""
    task_id = f"order-7-confirmation-{uuid.uuid4().hex[:6]}"
    with Session(pg_engine) as session, session.begin():
        outbox.enqueue(
            session,
            **outbox.celery_task_message(
                "shop.send_confirmation",
                kwargs={"order_id": 7, "notify": False},
                exchange=celery_worker.queue,
                routing_key=celery_worker.queue,
                task_id=task_id,
            ),
        )
    relay_factory(pg_url)

    (ran,) = wait_until(lambda: celery_worker.ran, timeout=15, what="the task to run")
    assert ran == {
        "args": (7, False),
        "id": task_id,
        "routing_key": celery_worker.queue,
        "exchange": celery_worker.queue,
    }
