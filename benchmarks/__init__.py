"""Benchmarks: the raw pika confirmed-publish ceiling against the relay's drain rate.

Run with `python -m benchmarks` (or `make bench`); `--help` lists the options. Everything the run
creates (a PostgreSQL database, a RabbitMQ exchange and queue) is named after the process id and
removed at the end.
"""
