"""A real three-node RabbitMQ cluster on this machine, to kill, pause and restart node by node.

    python -m tests.faults.rabbit_cluster up|down|status|kill N|pause N|resume N|restart N|leader Q

(scripts/rabbitmq-cluster.sh is the same.) The nodes are rabbit-o1@localhost .. rabbit-o3@localhost,
AMQP on 127.0.0.1:5681-5683, Erlang distribution on 25681-25683, no management or prometheus
listener; their data, logs, configuration and Erlang cookie live under one directory
(OUTBOX_RABBIT_CLUSTER_DIR, default /tmp/outbox-rabbit-cluster) that `down` removes. They run as
the caller, with their own configuration files: the machine's broker (rabbit@localhost on 5672,
/etc/rabbitmq, the rabbitmq user's cookie) is never read nor touched.

net_ticktime is 10 s (Erlang's default is 60): a paused node is taken for gone within 10-14 s,
so a pause fault lasts seconds rather than minutes. Users keep their own setting.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path("/usr/lib/rabbitmq/bin")
NODES = 3
AMQP_BASE = 5681
DIST_BASE = 25681
NET_TICKTIME = 10
BASE = Path(os.environ.get("OUTBOX_RABBIT_CLUSTER_DIR", "/tmp/outbox-rabbit-cluster"))


@dataclass(frozen=True)
class Node:
    n: int  # 1..NODES

    @property
    def name(self) -> str:
        return f"rabbit-o{self.n}@localhost"

    @property
    def port(self) -> int:
        return AMQP_BASE + self.n - 1

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def home(self) -> Path:
        return BASE / f"o{self.n}"

    @property
    def pid_file(self) -> Path:
        return self.home / "pid"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def env(self) -> dict[str, str]:
        """The node's environment: nothing inherited that names the machine's broker."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        return keep | {
            "HOME": str(BASE),  # the cookie: $HOME/.erlang.cookie, for the node and the CLI
            "RABBITMQ_CONF_ENV_FILE": str(BASE / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(DIST_BASE + self.n - 1),
            "RABBITMQ_MNESIA_BASE": str(self.home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.home / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.home / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.home / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(BASE / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            # Distribution on the loopback only, as the machine's broker.
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }


ALL = [Node(n) for n in range(1, NODES + 1)]


def node(n: int) -> Node:
    if not 1 <= n <= NODES:
        raise SystemExit(f"no node {n}: nodes are 1..{NODES}")
    return ALL[n - 1]


def urls(first: int = 1) -> str:
    """The nodes' URLs as a user gives them to --amqp, starting with node `first`."""
    order = ALL[first - 1 :] + ALL[: first - 1]
    return ",".join(n.url for n in order)


def ctl(n: Node, *args: str, timeout: float = 60.0, check: bool = True) -> str:
    done = subprocess.run(
        [str(BIN / "rabbitmqctl"), "-q", "-n", n.name, *args],
        env=n.env(), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl -n {n.name} {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _write_files() -> None:
    BASE.mkdir(parents=True, exist_ok=True)
    cookie = BASE / ".erlang.cookie"
    if not cookie.exists():
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
    (BASE / "rabbitmq-env.conf").write_text("")
    (BASE / "enabled_plugins").write_text("[rabbitmq_consistent_hash_exchange].\n")
    for n in ALL:
        n.home.mkdir(parents=True, exist_ok=True)
        (n.home / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{n.port}\n"
            "log.console = false\nlog.file.level = info\n"
            "cluster_partition_handling = pause_minority\n"
        )
        (n.home / "advanced.config").write_text(
            f"[{{kernel, [{{net_ticktime, {NET_TICKTIME}}}]}}].\n"
        )


def start(n: Node) -> None:
    """Start the node's server in the background (its log: the node's log directory)."""
    if n.pid() is not None:
        return
    # Started by a shell that exits at once: the server is nobody's child to wait for.
    subprocess.run(
        ["sh", "-c", '"$0" >>"$1" 2>&1 </dev/null &', str(BIN / "rabbitmq-server"),
         str(n.home / "server.out")],
        env=n.env(), cwd=n.home, check=True, start_new_session=True, timeout=30,
    )  # fmt: skip


def await_started(n: Node, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pid_file_there = n.pid_file.exists()
        if pid_file_there:
            args = ("wait", "--timeout", str(int(max(1, deadline - time.monotonic()))))
            done = subprocess.run(
                [str(BIN / "rabbitmqctl"), "-q", "-n", n.name, *args, str(n.pid_file)],
                env=n.env(), capture_output=True, text=True, timeout=timeout, check=False,
            )  # fmt: skip
            if done.returncode == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n.name} did not start: see {n.home / 'log'}")
        time.sleep(0.2)


def members(n: Node) -> list[str]:
    """The running nodes as node `n` sees them."""
    status = json.loads(ctl(n, "cluster_status", "--formatter", "json"))
    return sorted(status.get("running_nodes", []))


def up() -> None:
    """Start the three nodes (at once) and join 2 and 3 to 1; nothing if they are up already."""
    _write_files()
    for n in ALL:
        start(n)
    for n in ALL:
        await_started(n)
    names = sorted(n.name for n in ALL)
    if members(ALL[0]) == names:
        return
    for n in ALL[1:]:
        if ALL[0].name in members(n):
            continue
        ctl(n, "stop_app")
        ctl(n, "join_cluster", ALL[0].name)
        ctl(n, "start_app")
    if members(ALL[0]) != names:
        raise RuntimeError(f"the cluster did not form: {members(ALL[0])}")


def down() -> None:
    """Kill every node and remove the cluster's directory."""
    for n in ALL:
        pid = n.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused node would not die of SIGTERM's handler
                os.kill(pid, signal.SIGKILL)
    for n in ALL:
        _gone(n)
    shutil.rmtree(BASE, ignore_errors=True)


def _gone(n: Node, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while n.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)


def kill(n: Node) -> None:
    """SIGKILL the node's Erlang VM: its connections drop at once, nothing is flushed."""
    pid = n.pid()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        _gone(n)


def pause(n: Node) -> None:
    """SIGSTOP: the node's sockets stay open and silent (a hung VM, a partitioned host)."""
    pid = n.pid()
    if pid is not None:
        os.kill(pid, signal.SIGSTOP)


def resume(n: Node) -> None:
    pid = n.pid()
    if pid is not None:
        os.kill(pid, signal.SIGCONT)


def restart(n: Node) -> None:
    """Stop the node cleanly and start it again; it rejoins the cluster from its own data."""
    if n.pid() is not None:
        ctl(n, "stop", check=False, timeout=120)
        _gone(n, 60)
    start(n)
    await_started(n)


def revive(n: Node) -> None:
    """Start a killed node again and wait until it runs."""
    start(n)
    await_started(n)


def leader(queue: str) -> Node | None:
    """The node that leads quorum queue `queue` (asked of a running node), or None."""
    for n in ALL:
        if n.pid() is None:
            continue
        try:
            rows = json.loads(ctl(n, "list_queues", "name", "leader", "--formatter", "json",
                                  timeout=20))  # fmt: skip
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            continue
        for row in rows:
            if row.get("name") == queue:
                return next((m for m in ALL if m.name == row.get("leader")), None)
    return None


def status() -> str:
    lines = []
    for n in ALL:
        pid = n.pid()
        state = "down" if pid is None else f"pid {pid}"
        lines.append(f"{n.name}  {n.url}  {state}")
    running = next((n for n in ALL if n.pid() is not None), None)
    if running is not None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, ValueError):
            lines.append(f"running nodes: {', '.join(members(running))}")
    lines.append(f"--amqp {urls()}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    usage = "usage: rabbitmq-cluster up|down|status|kill N|pause N|resume N|restart N|leader QUEUE"
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command in ("up", "down", "status") and not args:
        if command == "up":
            up()
            print(status())
        elif command == "down":
            down()
        else:
            print(status())
        return 0
    if command == "leader" and len(args) == 1:
        found = leader(args[0])
        print(found.n if found is not None else "none")
        return 0 if found is not None else 1
    actions = {"kill": kill, "pause": pause, "resume": resume, "restart": restart,
               "start": revive}  # fmt: skip
    if command in actions and len(args) == 1 and args[0].isdigit():
        actions[command](node(int(args[0])))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
