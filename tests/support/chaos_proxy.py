"""A TCP forwarder the tests can take down and bring back: the database "goes away" for the
worker behind it (connections refused, live sessions cut) while the test keeps its own.

No port is picked, released, then bound again (another process could take it in between):
a socket bound and never listening holds each port for as long as it is in use, and on
Linux a port bound that way refuses connections."""

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


def _loopback_socket(port: int) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:`port` (0: any free port), sharing the port only with
    the other sockets of this module (SO_REUSEPORT), not listening yet."""
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection for as long as the block runs."""
    holder = _loopback_socket(0)
    try:
        yield int(holder.getsockname()[1])
    finally:
        holder.close()


class Proxy:
    """Forwards 127.0.0.1:<port> to `upstream`; `stop()` refuses and cuts, `start()` resumes,
    `close()` gives the port back. Until the first `start()` the port refuses connections.
    `port`: the port to take (one a server already advertises), or any free one."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        # Bound, never listening, until close(): while stopped the port refuses, and stays ours.
        self._holder = _loopback_socket(port)
        self.port = int(self._holder.getsockname()[1])
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0

    def start(self) -> None:
        listener = _loopback_socket(self.port)
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut the live ones (as a crashed server would)."""
        if self._listener is not None:
            with suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def close(self) -> None:
        """Stop, and release the port."""
        self.stop()
        self._holder.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
                self.connections += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with self._lock:
            for sock in (source, sink):
                if sock in self._open:
                    self._open.discard(sock)
                    sock.close()
