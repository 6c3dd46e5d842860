"""Apache Kafka itself, three nodes on loopback (KRaft; each node a broker and a controller),
for development and the real-cluster tests: `scripts/kafka.sh start|stop|status` and the
`kafka_cluster` pytest fixture both drive this module (docs/testing.md, "Apache Kafka itself").

The jars are the ones devtools/kafka/pom.xml pins; Maven resolves them (once, into ~/.m2) and
names their classpath. A cluster lives in one directory: each node's properties, data and log,
a throwaway CA and the brokers' certificate, the SCRAM users' passwords (mode 0600) and
`cluster.json`, which says how to reach and stop it. Each node listens on three loopback ports:

- PLAINTEXT: clients and the brokers among themselves; its principal (User:ANONYMOUS) is a
  super user, so development and the relay's tests need no credentials;
- SASL_SSL: SCRAM-SHA-512 over Kafka's own TLS, every request checked against the ACLs
  (StandardAuthorizer, nothing allowed without an ACL);
- CONTROLLER: the KRaft quorum (static voters);
- ROUTED, only in a cluster created `routed=True` (the fault tests): PLAINTEXT again on a fourth
  port, advertised as another port (`Node.route`) where a test runs a TCP proxy it can cut
  (tests/support/chaos_proxy.py). A client bootstrapped on the routes reaches each broker only
  through its proxy, while the brokers replicate and the tests read over PLAINTEXT: one broker
  unreachable from that client, and from no one else.

Topics default to what production should have: 6 partitions, replication factor 3,
`min.insync.replicas=2`, unclean leader election off."""

import argparse
import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "devtools" / "kafka" / "pom.xml"
LOG4J = ROOT / "devtools" / "kafka" / "log4j2.properties"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pin-profile"
NODES = 3
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
# A small node: three of them and the tests fit a 2-core, few-GiB machine.
HEAP = ("-Xms128m", "-Xmx384m")
JVM_OPTIONS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
               "-Djava.awt.headless=true")
# Who logs in over SASL_SSL: `admin` is a super user (ACLs, users); the relay's and the audit's
# principals get only the ACLs a test or an operator grants them.
USERS = ("admin", "pin_outbox_relay", "pin_outbox_audit")
SCRAM = "SCRAM-SHA-512"
# Ports below the kernel's ephemeral range: a node restarted on its port finds it free.
PORT_RANGE = (32_100, 32_700)


class KafkaSetupError(RuntimeError):
    """Java, Maven or the jars are missing, or a node would not start: the message says which
    and what to do."""


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaSetupError("java not found: install a Java 17 runtime "
                              "(Debian: apt-get install openjdk-17-jre-headless)")
    return java


def classpath() -> str:
    """The broker's classpath: devtools/kafka/pom.xml's jars, resolved by Maven once (they are
    cached in ~/.m2, the classpath under ~/.cache/pin-profile by the pom's hash)."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    cached = CACHE / f"kafka-classpath-{digest}.txt"
    if cached.exists():
        path = cached.read_text().strip()
        if all(Path(jar).exists() for jar in path.split(os.pathsep)):
            return path
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError("mvn not found: install Maven (Debian: apt-get install maven); it "
                              f"fetches the Kafka jars that {POM.relative_to(ROOT)} pins")
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".tmp")
    done = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:build-classpath",
                           f"-Dmdep.outputFile={partial}"],
                          check=False, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not partial.exists():
        raise KafkaSetupError(f"mvn could not resolve the Kafka jars of {POM.relative_to(ROOT)} "
                              f"(exit {done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    partial.replace(cached)
    return cached.read_text().strip()


def _port_free(port: int) -> bool:
    """Whether `port` can be bound on loopback by a socket without SO_REUSEADDR: no socket holds
    it, and no connection of an earlier server is in TIME_WAIT on it. (Kafka's listeners would
    bind over TIME_WAIT, but a test's proxy on a node's route does not.)"""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    rng = secrets.SystemRandom()
    chosen: list[int] = []
    for _ in range(2000):
        port = rng.randrange(*PORT_RANGE)
        if port not in chosen and _port_free(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise KafkaSetupError(f"no {count} free loopback ports in {PORT_RANGE}")


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, never starting with
    '-' (a command line would take it for an option; Kafka's own random ids avoid it too)."""
    while True:
        candidate = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


@dataclass
class Node:
    id: int
    plaintext: int
    sasl_ssl: int
    controller: int
    pid: int | None = None
    # The ROUTED listener (a `routed` cluster): where the node listens, and the port it
    # advertises instead, a test's proxy's.
    routed: int | None = None
    route: int | None = None

    def properties(self, cluster: "KafkaCluster") -> str:
        voters = ",".join(f"{n.id}@127.0.0.1:{n.controller}" for n in cluster.nodes)
        tls = cluster.directory / "tls"
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        listeners = (f"PLAINTEXT://127.0.0.1:{self.plaintext},"
                     f"SASL_SSL://127.0.0.1:{self.sasl_ssl}")
        advertised, protocols = listeners, "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"
        if self.routed is not None:
            listeners += f",ROUTED://127.0.0.1:{self.routed}"
            advertised += f",ROUTED://127.0.0.1:{self.route}"
            protocols += ",ROUTED:PLAINTEXT"
        lines = {
            "process.roles": "broker,controller",
            "node.id": self.id,
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": f"{listeners},CONTROLLER://127.0.0.1:{self.controller}",
            "advertised.listeners": advertised,
            "listener.security.protocol.map": f"{protocols},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": cluster.directory / f"node-{self.id}" / "data",
            # Security: SCRAM over TLS on SASL_SSL, ACLs checked for everyone but the super users.
            "sasl.enabled.mechanisms": SCRAM,
            f"listener.name.sasl_ssl.{SCRAM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": tls / "broker.pem",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": tls / "ca.pem",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS;User:admin",
            "allow.everyone.if.no.acl.found": "false",
            # Production's topic defaults: a record acknowledged by acks=all is on two brokers.
            "num.partitions": 6,
            "default.replication.factor": 3,
            "min.insync.replicas": 2,
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": 3,
            "offsets.topic.num.partitions": 6,
            "transaction.state.log.replication.factor": 3,
            "transaction.state.log.min.isr": 2,
            "share.coordinator.state.topic.replication.factor": 3,
            "share.coordinator.state.topic.min.isr": 2,
            "auto.create.topics.enable": "true",
            # A small, quick development cluster.
            "group.initial.rebalance.delay.ms": 0,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "log.segment.bytes": 64 * 1024 * 1024,
            # Records are kept whatever their timestamp: the tests' events carry a pinned creation
            # time, which the default week of time-based retention deletes once it is past.
            "log.retention.ms": -1,
            "controlled.shutdown.enable": "true",
        }
        return "".join(f"{key}={value}\n" for key, value in lines.items())


@dataclass
class KafkaCluster:
    """A cluster in `directory` (made by `create`, or `load`ed from its cluster.json)."""

    directory: Path
    cluster_id: str
    nodes: list[Node]
    passwords: dict[str, str] = field(default_factory=dict, repr=False)
    # The nodes this process started, by id: waited for when they exit (no zombie, no warning).
    processes: dict[int, "subprocess.Popen[bytes]"] = field(default_factory=dict, repr=False)

    # --- how clients reach it --------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.plaintext}" for n in self.nodes)

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.sasl_ssl}" for n in self.nodes)

    @property
    def routed_bootstrap_servers(self) -> str:
        """The routes (a `routed` cluster): a client bootstrapped here reaches each broker
        through the proxy on its route, once a test runs one there."""
        if any(n.route is None for n in self.nodes):
            raise KafkaSetupError(f"{self.directory} was not created routed=True")
        return ",".join(f"127.0.0.1:{n.route}" for n in self.nodes)

    @property
    def ca_location(self) -> Path:
        return self.directory / "tls" / "ca.pem"

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def node_dir(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}"

    def log(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "server.log"

    def environment(self) -> dict[str, str]:
        """What `scripts/kafka.sh start` prints: the plaintext bootstrap first, then the secured
        listener and its CA (the passwords stay in `users.json`)."""
        return {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
                "KAFKA_SASL_SSL_BOOTSTRAP_SERVERS": self.sasl_ssl_bootstrap_servers,
                "KAFKA_SSL_CA_LOCATION": str(self.ca_location),
                "KAFKA_CLUSTER_DIR": str(self.directory)}

    # --- making, starting and stopping ---------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, *, routed: bool = False) -> "KafkaCluster":
        """A new cluster's files in `directory` (which must not hold one): ports, certificates,
        users, each node's properties and formatted storage; with `routed`, the ROUTED
        listener too (see the module's docstring). Nothing is started."""
        if (directory / "cluster.json").exists():
            raise KafkaSetupError(f"{directory} already holds a cluster: stop it "
                                  f"(scripts/kafka.sh stop --dir {directory}) or choose another")
        java, path = _java(), classpath()
        directory.mkdir(parents=True, exist_ok=True)
        per_node = 5 if routed else 3
        ports = _free_ports(per_node * NODES)
        nodes = [Node(i + 1, *ports[per_node * i:per_node * i + 3]) for i in range(NODES)]
        if routed:
            for i, node in enumerate(nodes):
                node.routed, node.route = ports[per_node * i + 3:per_node * i + 5]
        cluster = cls(directory.resolve(), _cluster_id(), nodes,
                      {user: secrets.token_urlsafe(18) for user in USERS})
        _make_tls(cluster.directory / "tls")
        scram = [arg for user, password in cluster.passwords.items()
                 for arg in ("--add-scram", f"{SCRAM}=[name={user},password={password}]")]
        formats = []
        for node in nodes:
            node_dir = cluster.node_dir(node.id)
            node_dir.mkdir(parents=True, exist_ok=True)
            (node_dir / "server.properties").write_text(node.properties(cluster))
            formats.append(subprocess.Popen(
                [java, *HEAP, "-cp", path, f"-Dlog4j2.configurationFile={LOG4J}",
                 "kafka.tools.StorageTool", "format", f"--cluster-id={cluster.cluster_id}",
                 "--config", str(node_dir / "server.properties"), *scram],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for node, process in zip(nodes, formats, strict=True):
            out, _ = process.communicate(timeout=120)
            if process.returncode != 0:
                raise KafkaSetupError(f"formatting node {node.id}'s storage failed: {out[-2000:]}")
        cluster.save()
        return cluster

    @classmethod
    def load(cls, directory: Path) -> "KafkaCluster":
        state = directory / "cluster.json"
        if not state.exists():
            raise KafkaSetupError(f"no cluster in {directory} (no cluster.json)")
        raw = json.loads(state.read_text())
        users = directory / "users.json"
        passwords = json.loads(users.read_text()) if users.exists() else {}
        return cls(directory, raw["cluster_id"], [Node(**n) for n in raw["nodes"]], passwords)

    def save(self) -> None:
        state = {"cluster_id": self.cluster_id, "nodes": [asdict(n) for n in self.nodes]}
        (self.directory / "cluster.json").write_text(json.dumps(state, indent=2) + "\n")
        users = self.directory / "users.json"
        users.touch(mode=0o600)
        users.write_text(json.dumps(self.passwords, indent=2) + "\n")

    def start(self, timeout: float = START_TIMEOUT_S) -> "KafkaCluster":
        """Every node not running is started; returns once every broker is ready."""
        for node in self.nodes:
            if not self.running(node.id):
                self.start_node(node.id, wait=False)
        self.wait_ready(timeout=timeout)
        return self

    def start_node(self, node_id: int, *, wait: bool = True,
                   timeout: float = START_TIMEOUT_S) -> None:
        node, java, path = self.node(node_id), _java(), classpath()
        log = self.log(node_id)
        with log.open("ab") as out:
            process = subprocess.Popen(
                [java, *HEAP, *JVM_OPTIONS, "-cp", path,
                 f"-Dlog4j2.configurationFile={LOG4J}",
                 f"-Dkafka.logs.dir={self.node_dir(node_id)}",
                 "kafka.Kafka", str(self.node_dir(node_id) / "server.properties")],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        node.pid = process.pid
        self.processes[node_id] = process
        self.save()
        if wait:
            self.wait_ready(timeout=timeout, nodes=[node_id])

    def running(self, node_id: int) -> bool:
        pid = self.node(node_id).pid
        if pid is None:
            return False
        if node_id in self.processes:
            return self.processes[node_id].poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie of ours (a node started by this process and killed) is not running
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
        except OSError:
            return False

    def signal_node(self, node_id: int, signum: signal.Signals) -> None:
        """Send `signum` to a node (SIGKILL, SIGSTOP, SIGCONT: the fault tests)."""
        pid = self.node(node_id).pid
        if pid is None or not self.running(node_id):
            raise KafkaSetupError(f"node {node_id} is not running")
        os.kill(pid, signum)
        if signum == signal.SIGKILL:
            self._wait_gone(node_id, STOP_TIMEOUT_S)

    def stop_node(self, node_id: int, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after `timeout`."""
        self.stop(timeout, nodes=[node_id])

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, nodes: Sequence[int] | None = None,
             kill: bool = False) -> None:
        """SIGTERM every node in `nodes` (default all) at once, SIGKILL what is left after
        `timeout` (or at once, with `kill`). At once: a controller that waits for a quorum the
        others took with them would wait out the timeout."""
        chosen = [self.node(i) for i in (nodes or [n.id for n in self.nodes])]
        running = [(n.id, n.pid) for n in chosen if n.pid is not None and self.running(n.id)]
        for _, pid in running:
            os.kill(pid, signal.SIGCONT)  # a stopped JVM cannot shut down
            os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node_id, pid in running:
            if not self._wait_gone(node_id, max(0.0, deadline - time.monotonic())):
                os.kill(pid, signal.SIGKILL)
                self._wait_gone(node_id, STOP_TIMEOUT_S)
        for node in chosen:
            node.pid = None
            self.processes.pop(node.id, None)
        self.save()

    def remove(self) -> None:
        """Kill every node and delete the cluster's directory (a throwaway cluster: nothing
        in it is worth a clean shutdown)."""
        self.stop(kill=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _wait_gone(self, node_id: int, timeout: float) -> bool:
        process = self.processes.get(node_id)
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        pid = self.node(node_id).pid
        return pid is None or _reap(pid, timeout)

    def wait_ready(self, *, timeout: float = START_TIMEOUT_S,
                   nodes: Sequence[int] | None = None) -> None:
        """Until every node in `nodes` (default all) is registered as a broker in the cluster's
        metadata and its SASL_SSL listener accepts; fails at once if a node's process exits."""
        wanted = set(nodes or [n.id for n in self.nodes])
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            for node_id in wanted:
                if not self.running(node_id):
                    raise KafkaSetupError(f"node {node_id} exited while starting; its log "
                                          f"{self.log(node_id)} ends: {_tail(self.log(node_id))}")
            seen = self.registered_brokers(timeout=2.0)
            if wanted <= seen and all(_accepts(self.node(i).sasl_ssl) for i in wanted):
                return
            time.sleep(0.25)
        raise KafkaSetupError(f"after {timeout:.0f}s brokers {sorted(wanted - seen)} are not "
                              f"ready; logs under {self.directory}")

    def registered_brokers(self, *, timeout: float = 5.0) -> set[int]:
        """The broker ids in the metadata of any node that answers (empty when none does)."""
        from confluent_kafka.admin import AdminClient

        live = [f"127.0.0.1:{n.plaintext}" for n in self.nodes if _accepts(n.plaintext)]
        if not live:
            return set()
        admin = AdminClient({"bootstrap.servers": ",".join(live), "log_level": 0,
                             "logger": _QUIET})
        try:
            return set(admin.list_topics(timeout=timeout).brokers)
        except Exception:  # not ready yet: asked again until the deadline
            return set()

    def client_config(self, user: str | None = None) -> dict[str, Any]:
        """librdkafka properties for a client of this cluster: plaintext as a super user, or
        SASL_SSL as `user` with the cluster's CA."""
        if user is None:
            return {"bootstrap.servers": self.bootstrap_servers}
        return {"bootstrap.servers": self.sasl_ssl_bootstrap_servers,
                "security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM,
                "sasl.username": user, "sasl.password": self.passwords[user],
                "ssl.ca.location": str(self.ca_location)}

    def java(self, main_class: str, *args: str, timeout: float = 120.0,
             input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run one of Kafka's Java tools (a main class on the cluster's classpath)."""
        return subprocess.run(
            [_java(), "-Xmx256m", "-cp", classpath(), f"-Dlog4j2.configurationFile={LOG4J}",
             main_class, *args],
            input=input_text, check=False, capture_output=True, text=True, timeout=timeout)


class _Quiet:
    """A logger for the readiness probe's admin client: a node not up yet is expected."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return self.log


_QUIET = _Quiet()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _reap(pid: int, timeout: float) -> bool:
    """Until `pid` is gone (reaped if it is our child); False after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        time.sleep(0.05)
    return False


def _tail(log: Path, chars: int = 2000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise KafkaSetupError("openssl not found (Debian: apt-get install openssl)")
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_tls(directory: Path) -> None:
    """A throwaway CA (ca.pem) and the brokers' key and certificate for localhost and
    127.0.0.1 in one PEM file (broker.pem, PKCS#8 key first), valid for 30 days."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "30",
             "-subj", "/CN=pin-profile development Kafka CA", cwd=directory)
    _openssl("req", *ec, "-keyout", "broker.key", "-out", "broker.csr", "-subj", "/CN=localhost",
             cwd=directory)
    (directory / "broker.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "broker.crt", "-days", "30", "-extfile", "broker.ext",
             cwd=directory)
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.pk8",
             cwd=directory)
    (directory / "broker.pem").write_text((directory / "broker.pk8").read_text()
                                          + (directory / "broker.crt").read_text())
    for name in ("ca.key", "broker.key", "broker.pk8", "broker.pem"):
        (directory / name).chmod(0o600)


# --- scripts/kafka.sh ----------------------------------------------------------------------

DEFAULT_DIR = Path(os.environ.get("KAFKA_CLUSTER_DIR", "/tmp/pin-profile-kafka"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/kafka.sh",
        description="A three-node Apache Kafka cluster (KRaft) on loopback for development "
                    "and tests (docs/testing.md).")
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"the cluster's directory (default {DEFAULT_DIR}, or "
                             "KAFKA_CLUSTER_DIR)")
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()
    try:
        if args.action == "start":
            fresh = not (directory / "cluster.json").exists()
            cluster = KafkaCluster.create(directory) if fresh else KafkaCluster.load(directory)
            began = time.monotonic()
            cluster.start()
            print(f"kafka.sh: {NODES} nodes ready in {time.monotonic() - began:.1f}s "
                  f"({'new' if fresh else 'restarted'}; {directory}; SASL users' passwords "
                  f"in {directory / 'users.json'})", file=sys.stderr)
            for name, value in cluster.environment().items():
                print(f"{name}={value}")
        elif args.action == "stop":
            if (directory / "cluster.json").exists():
                KafkaCluster.load(directory).stop()
                shutil.rmtree(directory, ignore_errors=True)
            print(f"kafka.sh: stopped; {directory} removed", file=sys.stderr)
        else:
            cluster = KafkaCluster.load(directory)
            up = [n.id for n in cluster.nodes if cluster.running(n.id)]
            print(f"nodes running: {up or 'none'}; brokers registered: "
                  f"{sorted(cluster.registered_brokers()) or 'none'}")
            return 0 if len(up) == NODES else 1
    except KafkaSetupError as exc:
        print(f"kafka.sh: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
