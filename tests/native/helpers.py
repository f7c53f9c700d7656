"""Helpers that run engine code in a child process (under seccomp, as another user, or
where a hang must become a failure instead of a stuck test run), and that feed a read
from a pipe in two parts."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvstored.native import IoFile

REPO = Path(__file__).resolve().parents[2]

# seccomp: BPF instructions and the audit architectures io_uring_setup (425) exists on.
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
NR_IO_URING_SETUP = 425


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def deny_io_uring_setup(error: int) -> None:
    """Makes io_uring_setup(2) fail with ``error`` in this process, as a container's
    seccomp profile does. Irreversible: call it in a child process only."""
    arch = _AUDIT_ARCH[platform.machine()]
    program = (_SockFilter * 6)(
        _SockFilter(_BPF_LD_W_ABS, 0, 0, 4),                     # A = arch
        _SockFilter(_BPF_JEQ_K, 0, 3, arch),                     # other arch: allow
        _SockFilter(_BPF_LD_W_ABS, 0, 0, 0),                     # A = syscall number
        _SockFilter(_BPF_JEQ_K, 0, 1, NR_IO_URING_SETUP),
        _SockFilter(_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | error),
        _SockFilter(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    )
    fprog = _SockFprog(len(program), program)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def seccomp_supported() -> tuple[bool, str]:
    if platform.machine() not in _AUDIT_ARCH:
        return False, f"no seccomp filter written for {platform.machine()}"
    if not os.path.exists("/proc/self/status") or "Seccomp" not in Path(
            "/proc/self/status").read_text():
        return False, "the kernel has no seccomp"
    return True, ""


CAP_IPC_LOCK = 14


def _drop_from_bounding_set(capability: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 60,
               drop_capability: int | None = None) -> dict:
    """Runs ``code`` in a fresh interpreter at the repository root and returns the JSON
    object it prints last. A timeout (a hang) fails the test. ``drop_capability`` removes
    that capability from the child (even as root: exec keeps only the bounding set)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORED_IO_")}
    environ.update(env or {})
    preexec = None
    if drop_capability is not None:
        def preexec() -> None:
            _drop_from_bounding_set(drop_capability)
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environ,
                              capture_output=True, text=True, timeout=timeout,
                              preexec_fn=preexec)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child process hung for {timeout} s; stderr:\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(f"the child process failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_until_drained(read_end: int, timeout: float = 20.0) -> None:
    """Wait until nothing is left to read in a pipe: a reader thread has taken what was
    there. A fixed sleep instead would race with a slow thread start on a busy machine."""
    deadline = time.monotonic() + timeout
    while select.select([read_end], [], [], 0)[0]:
        if time.monotonic() > deadline:
            raise AssertionError("the reader never took the pipe's contents")
        time.sleep(0.01)


def keep_native_logs(level: int) -> list[str]:
    """In a child process: from now on, the messages ``kvstored.native`` logs at ``level``
    or above are appended to the list returned (the child prints them for its test)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("kvstored.native")
    logger.addHandler(Keep())
    logger.setLevel(level)
    return messages


def read_a_pipe_in_two_parts(engine, buffers) -> tuple[list, dict[str, Any]]:
    """``engine`` reads one item into ``buffers`` (a buffer, or a list of them) from a pipe
    that holds ``first`` when the read starts and ``" second"`` only once the read has
    taken that: the first read comes back short and the engine must ask for the rest.
    Returns the read's results and the engine's ring statistics after it."""
    read_end, write_end = os.pipe()
    pipe = IoFile(read_end, "pipe")
    os.write(write_end, b"first")
    outcome: dict[str, Any] = {}

    def reader() -> None:
        outcome["result"] = engine.read([(pipe, 0, buffers)])
        outcome["stats"] = engine.ring_stats()

    thread = threading.Thread(target=reader)
    thread.start()
    wait_until_drained(read_end)  # the first read has taken "first" and come back short
    os.write(write_end, b" second")
    thread.join(10)
    os.close(write_end)
    pipe.close()
    assert not thread.is_alive(), "the read never completed after the second write"
    return outcome["result"], outcome["stats"]
