"""`kvstore` never hangs on an address that is not a kvstored: connecting and the hello
are bounded by client.connect_timeout, each request by client.timeout (flag, environment
or file). Real sockets, real `kvstore` processes."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kvstored.cli.exitcodes import ExitCode
from kvstored.wire import FrameReader, send_frame
from tests.daemon.harness import closed_port, kvstore

#: The default connect timeout is 3 s; a generous margin for a loaded 2-vCPU machine.
BOUND = 12.0


class _Server:
    """A listening socket on loopback whose peers get ``serve(conn)`` in a thread."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.serve = serve
        self.stop = threading.Event()
        self.peers: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.peers.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for peer in self.peers:
            peer.close()
        self.sock.close()


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], _Server]]:
    started: list[_Server] = []

    def start(serve: Callable[[socket.socket], None]) -> _Server:
        started.append(_Server(serve))
        return started[-1]

    yield start
    for s in started:
        s.close()


def _silent(conn: socket.socket) -> None:
    """Accept and never answer (the peer's bytes sit unread)."""


def _http_reply(conn: socket.socket) -> None:
    """What an HTTP server says to bytes that are not HTTP."""
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\n"
                 b"Content-Length: 11\r\nConnection: close\r\n\r\nBad Request")


def _hello_then_silence(conn: socket.socket) -> None:
    """A kvstored-speaking peer that greets and then never answers a request."""
    reader = FrameReader(conn)
    reader.recv_header()
    send_frame(conn, {"ok": True, "version": 1})
    reader.recv_header()


def _timed(*args: str, env: dict[str, str] | None = None):
    started = time.monotonic()
    run = kvstore(*args, timeout=60, env=env)
    return run, time.monotonic() - started


@pytest.mark.parametrize("command", [["status"], ["ls"], ["get", "k"], ["flush", "--wait"],
                                     ["recover"]])
def test_a_peer_that_never_answers_fails_within_the_connect_timeout(server, command):
    silent = server(_silent)
    run, took = _timed(*command, "--master", silent.address)
    assert run.returncode == ExitCode.UNREACHABLE, run.stderr
    assert took < BOUND, f"{command} took {took:.1f} s"
    assert f"{silent.address} did not answer the hello as kvstored does (no answer within " \
           "3s)".encode() in run.stderr


def test_an_http_server_fails_fast_naming_the_address(server):
    web = server(_http_reply)
    run, took = _timed("status", "--master", web.address)
    assert run.returncode == ExitCode.UNREACHABLE and took < BOUND, run.stderr
    assert f"{web.address} did not answer the hello as kvstored does".encode() in run.stderr
    assert run.stderr.count(b"\n") == 1, run.stderr


def test_a_real_http_server_fails_within_the_connect_timeout():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{httpd.server_address[1]}"
    try:
        run, took = _timed("status", "--master", address)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert run.returncode == ExitCode.UNREACHABLE and took < BOUND, run.stderr
    assert address.encode() in run.stderr


def test_a_closed_port_fails_at_once_naming_the_address():
    address = f"127.0.0.1:{closed_port()}"
    run, took = _timed("status", "--master", address)
    assert run.returncode == ExitCode.UNREACHABLE and took < BOUND, run.stderr
    assert f"cannot reach {address} (Connection refused)".encode() in run.stderr


def test_the_connect_timeout_comes_from_the_environment(server):
    silent = server(_silent)
    run, took = _timed("status", "--master", silent.address,
                       env={"KVSTORED_CLIENT_CONNECT_TIMEOUT": "500ms"})
    assert run.returncode == ExitCode.UNREACHABLE and took < BOUND, run.stderr
    assert b"(no answer within 0.5s)" in run.stderr


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_a_request_is_bounded_by_client_timeout(server, tmp_path, how):
    """The hello succeeds, the request is never answered: --timeout, then
    KVSTORED_CLIENT_TIMEOUT, then [client] timeout in the file bound the wait."""
    peer = server(_hello_then_silence)
    args, env = ["status", "--master", peer.address], {}
    if how == "flag":
        args += ["--timeout", "1s"]
    elif how == "env":
        env["KVSTORED_CLIENT_TIMEOUT"] = "1s"
    else:
        config = tmp_path / "kvstored.toml"
        config.write_text('[client]\ntimeout = "1s"\n')
        args += ["--config", str(config)]
    run, took = _timed(*args, env=env)
    assert run.returncode == ExitCode.UNREACHABLE, run.stderr
    assert f"the connection to {peer.address} failed during status: no answer within " \
           "1s".encode() in run.stderr
    assert took < BOUND, f"took {took:.1f} s"
