"""What the node checks before it takes a client's memory, on real files and sockets:
the filesystem a descriptor is on, and which process holds a TCP connection."""

from __future__ import annotations

import os
import socket

from kvstored.node.regions import (
    MEMORY_FILESYSTEMS,
    TMPFS_MAGIC,
    filesystem_type,
    holds_socket,
    socket_inode,
)


def test_memory_files_are_told_from_disk_files(tmp_path):
    memfd = os.memfd_create("kvstored-test")
    disk = os.open(tmp_path / "on-disk", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert filesystem_type(memfd) == TMPFS_MAGIC
        assert MEMORY_FILESYSTEMS.get(filesystem_type(disk)) is None or \
            str(tmp_path).startswith("/dev/shm")
    finally:
        os.close(memfd)
        os.close(disk)


def test_the_process_holding_a_connection_is_found_by_its_addresses():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, peer = server.accept()
        try:
            # The node's view: its own end is accepted.getsockname(), the peer is peer.
            inode = socket_inode(peer, accepted.getsockname())
            assert inode == os.stat(f"/proc/self/fd/{client.fileno()}").st_ino
            assert holds_socket(os.getpid(), inode)
            assert not holds_socket(os.getppid(), inode)
            assert socket_inode(("127.0.0.1", 1), accepted.getsockname()) is None
        finally:
            client.close()
            accepted.close()
