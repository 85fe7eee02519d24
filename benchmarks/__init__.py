"""Benchmarks: the raw pika confirmed-publish ceiling against the relay's drain rate, and what a
SIGKILL costs, each judged against its target.

Run with `python -m benchmarks` (or `make bench`); `--help` lists the options. Everything the run
creates (PostgreSQL databases, RabbitMQ exchanges and queues) is named after the process id or a
random suffix and removed at the end.
"""
