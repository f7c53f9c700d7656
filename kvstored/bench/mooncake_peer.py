"""Mooncake Store as a peer of ``kvstore bench store`` (PyPI
``mooncake-transfer-engine-non-cuda``; the CUDA wheel does not import without a GPU).

**The cluster** (:class:`MooncakeCluster`, driven by the parent): ``mooncake_master``
with its built-in HTTP metadata server, and ``mooncake_client``, Mooncake's standalone
"real client" that owns the memory segment (and, with offload on, the SSD tier), all
bound to 127.0.0.1.

**The measuring process** (``python -m kvstored.bench.mooncake_peer``, one per mode, so
that Mooncake's environment switches apply to it alone and a crash in its native code
cannot take the benchmark down) prints one JSON document. Modes:

- ``remote``: ``MooncakeDistributedStore.setup`` with no segment of its own (a pure
  client): every byte moves over Mooncake's TCP transport from the real client's segment,
  into registered buffers (``batch_put_from`` / ``batch_get_into``). ``MC_STORE_MEMCPY=0``
  is set for it: the wheel auto-enables a local-memcpy shortcut in TCP-only setups that
  assumes one address space, and every cross-process get then fails with TRANSFER_FAIL.
- ``shm``: ``setup_dummy``: Mooncake's standalone mode, where a "dummy" client forwards
  calls to the local real client over IPC and the data moves through shared memory
  (buffers from ``alloc_from_mem_pool``, registered); the real client copies between its
  segment and that shared memory.
- ``ssd``: a pure client against a cluster with offload on (master ``--enable_offload
  --offload_on_evict``, real client ``--enable_offload`` and
  ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``: Mooncake's bucket storage backend on local
  disk) and a small segment. The objects are put, then filler objects push them out of
  memory (Mooncake offloads an object when it evicts it); the replica descriptors
  confirm that each one is on local disk only; the page cache is dropped; then they are
  read back over TCP through the real client's offload RPC.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvstored.bench import BenchError
from kvstored.bench.store_workload import (
    BATCH,
    GET_OPS,
    Buffers,
    drop_page_cache,
    keys_for,
    run_op,
    run_ops,
)
from kvstored.processes import stop_process

PIP_NAME = "mooncake-transfer-engine-non-cuda"
#: mooncake_master's default --default_kv_lease_ttl (10 s), left as it is.
LEASE_SECONDS = 10
#: Filler rounds before the SSD phase reads whatever did reach the disk only.
FILL_ROUNDS = 4


def probe() -> tuple[dict[str, str] | None, str | None]:
    """The wheel's binaries, or why Mooncake cannot run here. Imports in a child process:
    the native module must not be loaded into the benchmark itself."""
    done = subprocess.run(
        [sys.executable, "-c", "import mooncake, mooncake.store; print(mooncake.__file__)"],
        capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return None, (f"Mooncake is not importable ({last}); install it with "
                      f"pip install {PIP_NAME} (or the project's [bench] extra)")
    package = Path(done.stdout.strip()).parent
    binaries = {}
    for name in ("mooncake_master", "mooncake_client"):
        found = package / name
        if not found.exists():
            located = shutil.which(name, path=str(Path(sys.executable).parent))
            found = Path(located) if located else found
        if not found.exists():
            return None, f"the Mooncake wheel has no {name} binary"
        binaries[name] = str(found)
    return binaries, None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}); see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{proc.args[0]} did not listen on {port}; see {log}")


class MooncakeCluster:
    """``mooncake_master`` plus a ``mooncake_client`` owning ``segment`` bytes; with
    ``ssd_dir``, offload to local disk is on."""

    def __init__(self, binaries: dict[str, str], workdir: Path, segment: int,
                 ssd_dir: Path | None = None) -> None:
        self.workdir = workdir
        self.segment = segment
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        rpc, http, metrics, client = (_free_port() for _ in range(4))
        self.master = f"127.0.0.1:{rpc}"
        self.metadata = f"http://127.0.0.1:{http}/metadata"
        self.real_client = f"127.0.0.1:{client}"
        offload = ["--enable_offload=true", "--offload_on_evict=true"] if ssd_dir else []
        self._start("master", [
            binaries["mooncake_master"], f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={http}", "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}", "--logtostderr", *offload], rpc)
        env = {}
        if ssd_dir is not None:
            ssd_dir.mkdir(parents=True, exist_ok=True)
            # Offload heartbeats every second (default 10 s), so filling the tier for the
            # SSD phase does not take minutes; reads do not depend on it.
            env = {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(ssd_dir.resolve()),
                   "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1"}
        self._start("client", [
            binaries["mooncake_client"], "--host=127.0.0.1", f"--port={client}",
            f"--global_segment_size={segment}", f"--master_server_address={self.master}",
            f"--metadata_server={self.metadata}", "--protocol=tcp", "--logtostderr",
            *(["--enable_offload=true"] if ssd_dir else [])], client, env)

    def _start(self, name: str, argv: list[str], port: int,
               env: dict[str, str] | None = None) -> None:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})})
        self.procs.append(proc)
        try:
            _wait_port(port, proc, log)
        except RuntimeError:
            self.stop()
            raise

    def measure(self, mode: str, size: int, count: int, timeout: float = 3600
                ) -> dict[str, Any]:
        """Run one measuring process; its JSON document (``error`` set if it failed)."""
        log = self.workdir / f"peer-{mode}-{size}.log"
        argv = [sys.executable, "-m", "kvstored.bench.mooncake_peer", "--mode", mode,
                "--size", str(size), "--count", str(count), "--master", self.master,
                "--metadata", self.metadata, "--real-client", self.real_client,
                "--segment", str(self.segment)]
        with open(log, "wb") as err:
            try:
                done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                return {"error": f"timed out after {timeout:.0f}s; see {log}"}
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"error": f"exited with {done.returncode}; see {log}: "
                             + _tail(log)}
        return json.loads(lines[-1])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, 20)
        self.procs.clear()


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


# -- the measuring process ---------------------------------------------------------------


class MooncakeTarget:
    """The workload's four calls on ``MooncakeDistributedStore`` with registered buffers."""

    def __init__(self, store: Any, buffers: Any, retry_puts_for: float = 0.0) -> None:
        self.store = store
        self.size = buffers.size
        self.src = buffers.src.ctypes.data
        self.dst = buffers.dst.ctypes.data
        self.retry_puts_for = retry_puts_for

    def put_one(self, key: str, slot: int) -> None:
        self.put_many([key], [slot])

    def put_many(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        pointers = [self.src + s * self.size for s in slots]
        deadline = time.monotonic() + self.retry_puts_for
        while True:
            codes = self.store.batch_put_from(list(keys), pointers, [self.size] * len(keys))
            if all(c == 0 for c in codes):
                return
            # Only the SSD fill retries: there the segment is full until Mooncake has
            # offloaded and evicted older objects (its next offload heartbeat).
            if time.monotonic() > deadline:
                raise RuntimeError(f"batch_put_from failed: codes {sorted(set(codes))}")
            failed = [(k, p) for k, p, c in zip(keys, pointers, codes) if c != 0]
            keys, pointers = [k for k, _ in failed], [p for _, p in failed]
            time.sleep(0.2)

    def get_one(self, key: str, slot: int) -> int:
        return self.store.get_into(key, self.dst + slot * self.size, self.size)

    def get_many(self, keys: Sequence[str], slots: Sequence[int]) -> list[int]:
        return self.store.batch_get_into(list(keys), [self.dst + s * self.size for s in slots],
                                         [self.size] * len(keys))


def _shm_allocator(store: Any):
    def allocate(nbytes: int):
        pointer = store.alloc_from_mem_pool(nbytes)
        if not pointer or store.register_buffer(pointer, nbytes) != 0:
            raise RuntimeError(f"alloc_from_mem_pool/register_buffer of {nbytes} bytes failed")
        return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(pointer), dtype=np.uint8)
    return allocate


def _disk_only(store: Any, keys: list[str]) -> list[str]:
    """The keys whose every replica is on local disk (none in memory)."""
    found = []
    for start in range(0, len(keys), 1024):
        chunk = keys[start:start + 1024]
        described = store.batch_get_replica_desc(chunk)
        for key in chunk:
            replicas = described.get(key) or []
            if replicas and not any(r.is_memory_replica() for r in replicas):
                found.append(key)
    return found


def _ssd(store: Any, buffers: Any, size: int, count: int, segment: int
         ) -> tuple[dict, dict]:
    target = MooncakeTarget(store, buffers, retry_puts_for=600)
    sets = {op: keys_for("mc-ssd", op.split("-")[1], count) for op in GET_OPS}
    for keys in sets.values():
        run_op(target, buffers, "put-batch", keys)
    wanted = sets["get-single"] + sets["get-batch"]
    # Push the objects out of memory with filler puts (Mooncake offloads what it
    # evicts): one and a half segments' worth per round.
    batch = buffers.batch
    per_round = max(batch, int(1.5 * segment / size) // batch * batch)
    filler = 0
    while True:
        run_op(target, buffers, "put-batch", keys_for("mc-fill", str(filler), per_round))
        filler += 1
        on_disk = set(_disk_only(store, wanted))
        if len(on_disk) == len(wanted) or filler >= FILL_ROUNDS:
            break
        # Asking for replica descriptors leases the objects, which pins them in memory
        # until the lease lapses; only then can the next round evict them.
        time.sleep(LEASE_SECONDS + 1)
    notes: dict[str, Any] = {"filler_rounds": filler, "disk_only": len(on_disk),
                             "wanted": len(wanted)}
    out = {}
    for op, keys in sets.items():
        # Whole batches only, so each object still lands in the slot it was put from.
        chunks = [keys[i:i + batch] for i in range(0, len(keys), batch)]
        keys = [k for chunk in chunks if on_disk.issuperset(chunk) for k in chunk]
        if not keys:
            raise BenchError(f"none of the {op} objects reached Mooncake's SSD tier only")
        notes[f"{op}_page_cache"] = drop_page_cache() or "dropped"
        out[op] = run_op(target, buffers, op, keys)
    return out, notes


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.mode in ("remote", "ssd"):
        os.environ["MC_STORE_MEMCPY"] = "0"  # see the module docstring
    # The [bench] extra: absent from a plain install, where probe() has said so already.
    from mooncake.store import MooncakeDistributedStore  # pyright: ignore[reportMissingImports]

    store = MooncakeDistributedStore()
    slots = BATCH * args.size
    if args.mode == "shm":
        code = store.setup_dummy(2 * slots + (64 << 20), 64 << 20, args.real_client)
        if code != 0:
            raise RuntimeError(f"setup_dummy({args.real_client}) returned {code}")
        buffers = Buffers(args.size, allocate=_shm_allocator(store))
    else:
        code = store.setup("127.0.0.1", args.metadata, 0, 64 << 20, "tcp", "", args.master)
        if code != 0:
            raise RuntimeError(f"setup returned {code}")
        buffers = Buffers(args.size)
        for array in (buffers.src, buffers.dst):
            if store.register_buffer(array.ctypes.data, array.nbytes) != 0:
                raise RuntimeError("register_buffer failed")
    notes: dict[str, Any] = {}
    if args.mode == "ssd":
        results, notes = _ssd(store, buffers, args.size, args.count, args.segment)
    else:
        results = run_ops(MooncakeTarget(store, buffers), buffers, f"mc-{args.mode}",
                          args.count)
    return {"results": results, "notes": notes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One Mooncake measurement, as JSON.")
    parser.add_argument("--mode", choices=("remote", "shm", "ssd"), required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--real-client", required=True)
    parser.add_argument("--segment", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        document = _run(args)
    except Exception as exc:  # reported in the JSON; the parent carries on
        document = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(document), flush=True)
    # Mooncake's native threads can hang interpreter shutdown; the answer is out.
    os._exit(0)


if __name__ == "__main__":
    main()
