"""kvstored's side of ``kvstore bench store``: a real ``kvstored up`` process, driven
through the public client and the ``kvstore`` admin commands.

Three runners, one daemon:

- ``kvstored-tcp``: ``connect(transport="tcp")``; values travel as raw frames after a
  msgpack header, received with ``recv_into`` straight into the caller's buffer;
- ``kvstored-shm``: ``connect(transport="shm")``; puts and gets copy through the node's
  mapped DRAM segment, the socket carries only metadata;
- ``kvstored-ssd``: objects put, flushed (``kvstore flush --wait``), evicted from DRAM
  (``kvstore evict --tier dram --all``) so that their only copy is on SSD (checked with
  ``status`` and ``stat``), the page cache dropped, then read over TCP (SSD objects are
  always sent by their node).

The daemon runs with ``--offload watermark`` and a DRAM tier four times the data of one
phase, so no background offload competes with the measured DRAM puts and gets (the
Mooncake cluster it is compared with does not offload either); the SSD runner flushes
explicitly. Between phases the keys are removed and the benchmark waits until the node
reports its DRAM free again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kvstored
from kvstored.bench import BenchError
from kvstored.bench.store_workload import (
    GET_OPS,
    Buffers,
    drop_page_cache,
    keys_for,
    run_op,
    run_ops,
)
from kvstored.processes import stop_process
from kvstored.protocol import ReplicaState, Tier

BANNER = re.compile(r"^kvstored up: listening on ([\d.]+):(\d+)")


def _tool(name: str) -> str:
    """The ``kvstored``/``kvstore`` script installed beside this interpreter."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


class KvstoredDaemon:
    """``kvstored up`` as a child process; its output goes to ``data``/../kvstored.log
    (appended across restarts) and its last lines into error messages."""

    def __init__(self, data: Path, dram: int, ssd: int, backend: str,
                 offload: str = "watermark") -> None:
        data.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = data.parent / "kvstored.log"
        self.lines: list[str] = []
        self._announced: str | None = None  # by the daemon's banner, read by _read
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            [_tool("kvstored"), "up", "--listen", "127.0.0.1:0", "--data", str(data),
             "--dram", str(dram), "--ssd", str(ssd), "--backend", backend,
             "--offload", offload],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # A benchmark's objects are disposable: stopping need not write them to SSD.
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 "KVSTORED_NODE_SHUTDOWN_FLUSH_TIMEOUT": "0"})
        threading.Thread(target=self._read, daemon=True).start()
        self._ready.wait(120)
        if self._announced is None:
            self.stop()
            raise BenchError("kvstored up did not start:\n" + self.log)
        self.address: str = self._announced

    def _read(self) -> None:
        output = self.proc.stdout
        assert output is not None  # stdout=PIPE
        with open(self.log_path, "a") as log:
            for line in output:
                log.write(line)
                log.flush()
                self.lines.append(line.rstrip())
                self._banner(line)
        self._ready.set()

    def _banner(self, line: str) -> None:
        match = BANNER.search(line)
        if match and self._announced is None:
            self._announced = f"{match.group(1)}:{match.group(2)}"
            self._ready.set()

    @property
    def log(self) -> str:
        return "\n".join(self.lines[-40:])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def admin(self, *args: str) -> dict[str, Any]:
        """Run ``kvstore ARGS --master ADDR --json``; its JSON document."""
        done = subprocess.run([_tool("kvstore"), *args, "--master", self.address, "--json"],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise BenchError(f"kvstore {' '.join(args)} failed ({done.returncode}): "
                                f"{done.stderr.strip() or done.stdout.strip()}")
        return json.loads(done.stdout)

    def stop(self) -> None:
        stop_process(self.proc, 60)


class KvstoredTarget:
    """The workload's four calls on the blocking client."""

    def __init__(self, client: kvstored.Client, buffers: Buffers) -> None:
        self.client = client
        self.buffers = buffers

    def put_one(self, key: str, slot: int) -> None:
        if not self.client.put(key, self.buffers.src_slot(slot)):
            raise BenchError(f"put {key!r}: the key already existed")

    def put_many(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        stored = self.client.batch_put(keys, [self.buffers.src_slot(s) for s in slots])
        if not all(stored):
            raise BenchError(f"batch_put: {stored.count(False)} keys already existed")

    def get_one(self, key: str, slot: int) -> int:
        return self.client.get_into(key, self.buffers.dst_slot(slot))

    def get_many(self, keys: Sequence[str], slots: Sequence[int]) -> list[int]:
        return self.client.batch_get_into(keys, [self.buffers.dst_slot(s) for s in slots])


class KvstoredRunner:
    """One daemon for every size; ``run_size`` measures the three runners at one size."""

    def __init__(self, data: Path, per_phase: int, backend: str) -> None:
        # Four phases' worth: two live sets (single + batch) and room to spare, so the
        # watermark policy never offloads during a DRAM phase.
        self.dram = max(256 << 20, 4 * per_phase)
        self.ssd = max(1 << 30, 8 * per_phase)
        self.data, self.backend = data, backend
        self.daemon = KvstoredDaemon(data, self.dram, self.ssd, backend)

    def ensure_running(self) -> str | None:
        """After a runner failed: restart a daemon that died (on fresh data, since its
        state is unknown); what happened, for the JSON."""
        if self.daemon.alive:
            return None
        code = self.daemon.proc.returncode
        tail = self.daemon.log
        shutil.rmtree(self.data, ignore_errors=True)
        self.daemon = KvstoredDaemon(self.data, self.dram, self.ssd, self.backend)
        return f"kvstored exited with {code}; restarted on fresh data. Its last lines:\n{tail}"

    def close(self) -> None:
        self.daemon.stop()

    def _connect(self, transport: str) -> kvstored.Client:
        return kvstored.connect(self.daemon.address, transport=transport, timeout=600)

    def _remove(self, client: kvstored.Client, keys: list[str]) -> None:
        for start in range(0, len(keys), 4096):
            client.batch_remove(keys[start:start + 4096])
        # Removal frees DRAM once leases lapse (seconds). A phase fills at most half
        # the tier; wait until at most a quarter is still in use, so the next phase
        # never crosses the offload watermark (70%).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            nodes = client.call("status")["nodes"]
            if all(n["dram"]["used"] <= 0.25 * n["dram"]["capacity"] for n in nodes):
                return
            time.sleep(0.2)

    def run_dram(self, transport: str, size: int, count: int, buffers: Buffers,
                 prefix: str) -> dict[str, dict]:
        with self._connect(transport) as client:
            try:
                return run_ops(KvstoredTarget(client, buffers), buffers, prefix, count)
            finally:
                self._remove(client, keys_for(prefix, "single", count)
                             + keys_for(prefix, "batch", count))

    def run_ssd(self, size: int, count: int, buffers: Buffers, prefix: str
                ) -> tuple[dict[str, dict], dict[str, Any]]:
        """Both read ops on objects whose only copy is on SSD; also returns how the
        objects were placed there (flush and evict replies, page-cache state)."""
        single, batched = keys_for(prefix, "single", count), keys_for(prefix, "batch", count)
        notes: dict[str, Any] = {}
        with self._connect("tcp") as client:
            target = KvstoredTarget(client, buffers)
            run_op(target, buffers, "put-batch", single)
            run_op(target, buffers, "put-batch", batched)
            notes["flushed"] = self.daemon.admin("flush", "--wait")["queued"]
            evicted = self.daemon.admin("evict", "--tier", "dram", "--all")
            notes["evicted"] = len(evicted["evicted"])
            notes["ssd_only"] = self._wait_ssd_only(client, single + batched)
            out = {}
            for op, keys in zip(GET_OPS, (single, batched)):
                notes[f"{op}_page_cache"] = drop_page_cache() or "dropped"
                out[op] = run_op(target, buffers, op, keys)
            self._remove(client, single + batched)
        return out, notes

    @staticmethod
    def _wait_ssd_only(client: kvstored.Client, keys: list[str]) -> int:
        """Wait until no object has a DRAM copy (drops land with the next heartbeat);
        the number of SSD objects."""
        deadline = time.monotonic() + 600
        while True:
            tiers = client.call("status")["tiers"]
            if tiers["dram"]["objects"] == 0 and tiers["ssd"]["objects"] >= len(keys):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"objects still in DRAM after evict --all: {tiers}")
            time.sleep(0.2)
        for key in keys[:: max(1, len(keys) // 16)]:  # and ask about a sample directly
            info = client.stat(key)
            # A DRAM replica still "removing" is never handed to readers.
            readable = {r.tier for r in info.replicas
                        if r.state is ReplicaState.COMPLETE} if info else set()
            if readable != {Tier.SSD}:
                raise BenchError(f"{key!r} is not SSD-only: {info}")
        return tiers["ssd"]["objects"]
