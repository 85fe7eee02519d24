#!/usr/bin/env bash
# Make sure the local PostgreSQL and RabbitMQ the tests use are up: start them if they are
# installed but stopped, otherwise fail at once with one line saying what is missing.
set -u

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {  # port seconds
    for _ in $(seq 1 "$2"); do port_open "$1" && return 0; sleep 1; done
    return 1
}

if ! port_open 5432; then
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
        echo "starting PostgreSQL..." >&2
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start >&2 || true
        wait_port 5432 30 || { echo "error: PostgreSQL is installed but did not start on 127.0.0.1:5432" >&2; exit 1; }
    else
        echo "error: PostgreSQL is not running on 127.0.0.1:5432 and is not installed here (install postgresql, or run: docker compose up -d postgres)" >&2
        exit 1
    fi
fi

# Logical capture (relay/capture) reads a replication slot, which needs wal_level = logical. The
# setting takes effect at a restart only, so the cluster is restarted once, when it changes.
pg_sql() { psql -h 127.0.0.1 -U postgres -d postgres -XAtqc "$1" 2>/dev/null; }
wal_level_within() {  # seconds: SHOW wal_level, asked again while the server is starting up
    local level
    for _ in $(seq 1 "$1"); do
        level=$(pg_sql 'SHOW wal_level') && [ -n "$level" ] && { echo "$level"; return 0; }
        sleep 1
    done
    return 1
}
wal_level=$(wal_level_within 15)
if [ "$wal_level" != logical ]; then
    if [ -z "$wal_level" ] || ! command -v pg_ctlcluster >/dev/null 2>&1 || [ ! -d /etc/postgresql ]; then
        echo "error: cannot set wal_level = logical here (as a superuser: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL)" >&2
        exit 1
    fi
    echo "setting PostgreSQL's wal_level to logical (was ${wal_level}) and restarting it..." >&2
    pg_sql 'ALTER SYSTEM SET wal_level = logical' >/dev/null \
        && pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main restart >/dev/null 2>&1 \
        && wait_port 5432 30 \
        && wal_level=$(wal_level_within 30)
    if [ "$wal_level" != logical ]; then
        echo "error: could not set PostgreSQL's wal_level to logical (it is ${wal_level:-unknown}; as a superuser: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL)" >&2
        exit 1
    fi
fi

if ! port_open 5672; then
    if command -v rabbitmq-server >/dev/null 2>&1; then
        echo "starting RabbitMQ..." >&2
        rabbitmq-server -detached >&2 || true
        wait_port 5672 90 || { echo "error: RabbitMQ is installed but did not start on 127.0.0.1:5672" >&2; exit 1; }
    else
        echo "error: RabbitMQ is not running on 127.0.0.1:5672 and is not installed here (install rabbitmq-server, or run: docker compose up -d rabbitmq)" >&2
        exit 1
    fi
fi

# Partitioned queues (outbox-relay topology) need RabbitMQ's consistent-hash exchange, a plugin
# shipped with the broker but not enabled by default.
if command -v rabbitmq-plugins >/dev/null 2>&1 \
    && ! rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_consistent_hash_exchange; then
    echo "enabling rabbitmq_consistent_hash_exchange..." >&2
    rabbitmq-plugins enable rabbitmq_consistent_hash_exchange >/dev/null 2>&1 \
        || { echo "error: could not enable the RabbitMQ plugin (rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)" >&2; exit 1; }
fi

# MariaDB: the MySQL-family store's tests run against it. Started if installed and stopped.
if ! port_open 3306 && [ -x /usr/sbin/mariadbd ]; then
    echo "starting MariaDB..." >&2
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >&2 || true
    wait_port 3306 30 || echo "warning: MariaDB is installed but did not start on 127.0.0.1:3306" >&2
fi

# Debian packages the tests drive but a new machine lacks: PgBouncer (transaction pooling in
# front of PostgreSQL), Chromium (the console's browser tests) and Prometheus (promtool checks
# and tests deploy/prometheus/alerts.yaml; a real server scrapes a relay). Installed once; apt's
# index is refreshed only when a package is missing.
missing=()
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
[ -x /usr/bin/chromium ] || missing+=(chromium)
{ command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; } || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing ${missing[*]} from Debian's packages..." >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1 \
            || { echo "error: could not install ${missing[*]} (apt-get install -y ${missing[*]})" >&2; exit 1; }
        # The Debian package starts its own PgBouncer on 6432; the tests start their own.
        service pgbouncer stop >/dev/null 2>&1 || pkill -x pgbouncer 2>/dev/null || true
        # Prometheus's package starts a server on 9090 (and its node exporter on 9100); the tests
        # start their own on a free port. (pkill matches the first 15 characters of a name.)
        service prometheus stop >/dev/null 2>&1 || pkill -x prometheus 2>/dev/null || true
        service prometheus-node-exporter stop >/dev/null 2>&1 || pkill -x prometheus-node 2>/dev/null || true
    else
        echo "error: ${missing[*]} missing; install with: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
exit 0
