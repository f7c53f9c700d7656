"""The floor and ceiling of ``kvstore bench store``: a raw Python socket and memcpy.

**Raw socket.** A server process holds ``count`` objects of ``size`` bytes in one
pre-touched buffer (as a store would). The client sends a 16-byte request, the server
answers with the raw bytes of the objects asked for (``sendmsg`` of the object views, as
kvstored's node does) and the client ``recv_into``s each object's destination slot; a put
is the mirror image, acknowledged with one byte. There is no key lookup, no header
parsing, no checksum and no allocation: this is what one Python socket stream can move
per request on this machine, the bar kvstored's TCP path is held to.

**memcpy.** ``numpy.copyto`` between an object area of ``count`` x ``size`` bytes and the
pre-touched slots: the bar for same-host shared memory.

Run ``python -m kvstored.bench.raw_peers --size N --count N`` to start a server by hand;
it prints ``raw-socket server on HOST:PORT`` and serves one connection at a time.
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

from kvstored.bench.store_workload import Buffers
from kvstored.processes import stop_process
from kvstored.wire import recv_exactly_into

#: op (b"G" get / b"P" put), first object, object count, padding.
REQUEST = struct.Struct("<1sxxxIIxxxx")


def _object_area(size: int, count: int) -> np.ndarray:
    area = np.empty(size * count, dtype=np.uint8)
    area.fill(1)  # pre-touch: the store's memory is in use, not fresh
    return area


def serve(size: int, count: int, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve raw gets and puts of objects ``[0, count)`` until the parent goes away."""
    area = _object_area(size, count)
    views = [memoryview(area[i * size:(i + 1) * size]) for i in range(count)]
    listener = socket.create_server((host, port))
    print(f"raw-socket server on {host}:{listener.getsockname()[1]}", flush=True)
    request = bytearray(REQUEST.size)
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            try:
                while True:
                    recv_exactly_into(conn, memoryview(request))
                    op, first, n = REQUEST.unpack(request)
                    if op == b"G":
                        pieces = views[first:first + n]
                        while pieces:
                            sent = conn.sendmsg(pieces)
                            while sent:
                                if sent >= len(pieces[0]):
                                    sent -= len(pieces[0])
                                    pieces.pop(0)
                                else:
                                    pieces[0] = pieces[0][sent:]
                                    sent = 0
                    else:
                        for view in views[first:first + n]:
                            recv_exactly_into(conn, view)
                        conn.sendall(b"k")
            except Exception:  # the client closed; wait for the next one
                continue


class RawSocketTarget:
    """The client side; keys are ``prefix/phase/index`` and index the server's objects."""

    def __init__(self, address: tuple[str, int], buffers: Buffers) -> None:
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffers = buffers
        self.ack = bytearray(1)

    @staticmethod
    def _index(key: str) -> int:
        return int(key.rsplit("/", 1)[1])

    def put_one(self, key: str, slot: int) -> None:
        self.put_many([key], [slot])

    def put_many(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        self.sock.sendmsg([REQUEST.pack(b"P", self._index(keys[0]), len(keys)),
                           *(memoryview(self.buffers.src_slot(s)) for s in slots)])
        recv_exactly_into(self.sock, memoryview(self.ack))

    def get_one(self, key: str, slot: int) -> int:
        return self.get_many([key], [slot])[0]

    def get_many(self, keys: Sequence[str], slots: Sequence[int]) -> list[int]:
        self.sock.sendall(REQUEST.pack(b"G", self._index(keys[0]), len(keys)))
        for slot in slots:
            recv_exactly_into(self.sock, memoryview(self.buffers.dst_slot(slot)))
        return [self.buffers.size] * len(keys)

    def close(self) -> None:
        self.sock.close()


class RawSocketServer:
    """The server as a child process (its own interpreter and GIL, like a daemon)."""

    def __init__(self, size: int, count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvstored.bench.raw_peers", "--size", str(size),
             "--count", str(count)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("raw-socket server on "):
            self.stop()
            raise RuntimeError(f"the raw-socket server did not start: {line!r}")
        host, port = line.split()[-1].rsplit(":", 1)
        self.address = (host, int(port))

    def stop(self) -> None:
        stop_process(self.proc, 10)


class MemcpyTarget:
    """Copies between an object area and the slots; a put-single writes the object's
    place in the area, as a same-host shared-memory put would."""

    def __init__(self, buffers: Buffers, count: int) -> None:
        self.buffers = buffers
        self.size = buffers.size
        self.area = _object_area(buffers.size, count)

    def _object(self, key: str) -> np.ndarray:
        i = int(key.rsplit("/", 1)[1])
        return self.area[i * self.size:(i + 1) * self.size]

    def put_one(self, key: str, slot: int) -> None:
        np.copyto(self._object(key), self.buffers.src_slot(slot))

    def put_many(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        for key, slot in zip(keys, slots):
            np.copyto(self._object(key), self.buffers.src_slot(slot))

    def get_one(self, key: str, slot: int) -> int:
        np.copyto(self.buffers.dst_slot(slot), self._object(key))
        return self.size

    def get_many(self, keys: Sequence[str], slots: Sequence[int]) -> list[int]:
        for key, slot in zip(keys, slots):
            np.copyto(self.buffers.dst_slot(slot), self._object(key))
        return [self.size] * len(keys)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The raw-socket peer's server.")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        serve(args.size, args.count, port=args.port)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
