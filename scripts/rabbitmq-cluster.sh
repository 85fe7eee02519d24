#!/bin/sh
# A three-node RabbitMQ cluster on this machine for fault tests (tests/faults/rabbit_cluster.py):
#   scripts/rabbitmq-cluster.sh up|down|status|kill N|pause N|resume N|restart N|start N|leader QUEUE
# Nodes rabbit-o1..o3@localhost on 127.0.0.1:5681-5683; the machine's broker on 5672 is untouched.
set -eu
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" -m tests.faults.rabbit_cluster "$@"
