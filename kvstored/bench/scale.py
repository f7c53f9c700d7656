"""``kvstore bench scale``: how kvstored's costs grow with the number of objects and of
clients, measured on a real ``kvstored master`` and ``kvstored node`` (one process each).

For each backend named (file-per-key and bucket by default), on a fresh store:

1. **Puts.** ``--objects`` small objects (``--value-size`` bytes each) are put in batches,
   with a flush to SSD (``flush --wait``) every ``FLUSH_EVERY`` objects so that DRAM
   always has room; the rate of puts and flushes together is recorded on the way.
2. **The master's memory per object:** the growth of the master process's resident set
   (VmRSS) from before the first put to after the flush, over the objects it then holds,
   with the replicas it holds per tier (an object put and flushed has a DRAM and an SSD
   replica until DRAM evicts it); and the disk the node's store then takes (allocated
   blocks of every file under its data directory), per object.
3. **Lookup latency:** single-key ``lookup`` and ``exists`` requests to the master for
   random keys, timed by the client (one TCP round trip each), at the first thousand
   objects and again at ``--objects``: the growth between the two is what the table's
   size costs.
4. **Recovery:** the node is stopped (SIGTERM) and started again on the same data, and
   the time from its start until the master holds all its SSD objects again is taken:
   the backend's own recovery, its scan, and the registration of every object.
5. **Clients:** 1, 2 and 4 client processes (``--clients``) each get random keys of the
   store, one key per request, for ``--seconds``; the total and per-process rates and the
   median latency are recorded.

With ``--metadata-only`` no node and no value is involved: an inventory node (bench/
inventory.py) registers ``--objects`` objects' metadata with the master through the ops
and batches of a recovering node, first the thousand of the small table, then all of
them (a re-registration: the master drops the node's objects and takes the whole
inventory again, timed), and phases 2 and 3 are measured on that master. This reaches
table sizes whose values would not fit this machine's disk or time; the recovery figure
it gives is the master's share of one (registration), not a node's (its backend's scan).

Latency, recovery and client figures are taken ``--rounds`` times; each figure is the
median of its rounds. The load average is recorded before and after, for the machine is
shared. Not measured here: data-path throughput (``bench store``) and the io engine
(``bench io``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

import kvstored
from kvstored.bench import BenchError, say
from kvstored.bench.inventory import InventoryNode
from kvstored.processes import stop_process
from kvstored.sdk.files import allocated_bytes
from kvstored.sdk.units import format_size, parse_size
from kvstored.security import create_token_file, read_token_file

BACKENDS = ("file-per-key", "bucket")
PUT_BATCH = 1024
#: Objects put between two flushes to SSD: the DRAM tier (``DRAM``) holds them whole even
#: at its 4 KiB granule, so the puts never wait for the offloads to catch up.
FLUSH_EVERY = 16 * PUT_BATCH
DRAM = 256 << 20
#: Disk a small object may take on SSD, padding and index included (the bucket backend
#: takes 8,250 B per 256-byte object: a 4 KiB header block, the value padded to 4 KiB,
#: its index entry): the run needs this much free.
SSD_PER_OBJECT = 8192
#: The object count the first lookup latencies are taken at.
SMALL_TABLE = 1000
#: Lookups per round and kind.
LOOKUPS = 2000
#: Bytes of memory the benchmark assumes per object for master, node and client together,
#: to refuse a run the machine cannot hold (1M objects measured well under this).
BUDGET_PER_OBJECT = 4096
#: The same for --metadata-only: the master alone holds the objects (about 550-770 bytes
#: each was measured), the benchmark streams the inventory in chunks.
METADATA_BUDGET_PER_OBJECT = 768
#: Never use more than this much memory, whatever the machine has free.
MEMORY_CAP = 8 << 30
MASTER_BANNER = re.compile(r"^kvstored master: listening on ([\d.]+):(\d+)")
NODE_BANNER = re.compile(r"^kvstored node: data server on ([\d.]+):(\d+)")
REGISTERED = re.compile(r"registered (\d+) objects with the master")


def _tool(name: str) -> str:
    """The ``kvstored`` script installed beside this interpreter."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


class _Daemon:
    """A ``kvstored master`` or ``kvstored node`` child; its output goes to ``log_path``
    and its last lines into error messages."""

    def __init__(self, args: list[str], banner: re.Pattern[str], log_path: Path) -> None:
        self.args = args
        self.lines: list[str] = []
        self.line_times: list[float] = []  # when each line was read
        self.address: str | None = None
        self._banner = banner
        self._ready = threading.Event()
        self._new_line = threading.Condition()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [_tool("kvstored"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                            # The benchmark's objects are disposable, and already on SSD.
                            "KVSTORED_NODE_SHUTDOWN_FLUSH_TIMEOUT": "0"})
        threading.Thread(target=self._read, args=(log_path,), daemon=True).start()
        self._ready.wait(120)
        if self.address is None:
            self.stop()
            raise BenchError(f"kvstored {args[0]} did not start:\n{self.log}")

    def _read(self, log_path: Path) -> None:
        with open(log_path, "a") as log:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                with self._new_line:
                    self.lines.append(line.rstrip())
                    self.line_times.append(time.perf_counter())
                    self._new_line.notify_all()
                match = self._banner.search(line)
                if match and self.address is None:
                    self.address = f"{match.group(1)}:{match.group(2)}"
                    self._ready.set()
        self._ready.set()

    @property
    def log(self) -> str:
        return "\n".join(self.lines[-40:])

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> tuple[re.Match, float]:
        """The first output line matching ``pattern`` and when it was read."""
        deadline = time.perf_counter() + timeout
        seen = 0
        with self._new_line:
            while True:
                for index in range(seen, len(self.lines)):
                    match = pattern.search(self.lines[index])
                    if match:
                        return match, self.line_times[index]
                seen = len(self.lines)
                left = deadline - time.perf_counter()
                if left <= 0 or self.proc.poll() is not None:
                    raise BenchError(f"kvstored {self.args[0]} never logged "
                                     f"{pattern.pattern!r}:\n{self.log}")
                self._new_line.wait(min(left, 1.0))

    def rss(self) -> int:
        """The process's resident set, in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise BenchError(f"no VmRSS for kvstored {self.args[0]} (pid {self.proc.pid})")

    def stop(self, timeout: float = 120) -> None:
        stop_process(self.proc, timeout)


@dataclass
class Store:
    """One master and one node on a work directory, and a client of them."""

    work: Path
    backend: str
    dram: int
    ssd: int
    #: False: a master alone (``--metadata-only``; its inventory node comes from outside).
    with_node: bool = True
    master: _Daemon = field(init=False)
    node: _Daemon | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.token_file = self.work / "secrets" / "token"
        self.node_token_file = self.work / "secrets" / "node-token"
        create_token_file(self.token_file)
        create_token_file(self.node_token_file)
        self.tokens = ["--token-file", str(self.token_file),
                       "--node-token-file", str(self.node_token_file)]
        self.master = _Daemon(["master", "--listen", "127.0.0.1:0", *self.tokens],
                              MASTER_BANNER, self.work / "master.log")
        #: A node's start on an empty store: the floor under every recovery time.
        self.empty_start_s = 0.0
        if self.with_node:
            node = self.start_node()
            self.empty_start_s = self.wait_registered(0, timeout=120) - node.started
        self.client = self.connect()

    def start_node(self) -> _Daemon:
        assert self.master.address is not None
        self.node = _Daemon(["node", "--master", self.master.address, "--listen",
                             "127.0.0.1:0", "--data", str(self.work / "data"),
                             "--dram", str(self.dram), "--ssd", str(self.ssd),
                             "--backend", self.backend, "--name", "scale-node",
                             "--node-token-file", str(self.node_token_file)],
                            NODE_BANNER, self.work / "node.log")
        return self.node

    def connect(self) -> kvstored.Client:
        assert self.master.address is not None
        return kvstored.connect(self.master.address, transport="tcp",
                                token_file=str(self.token_file), timeout=600)

    def status(self) -> dict[str, Any]:
        return self.client.call("status")

    def wait_registered(self, count: int, timeout: float) -> float:
        """When the node logged that it registered its objects (it takes puts from
        then on); a BenchError unless they were ``count``."""
        assert self.node is not None
        match, when = self.node.wait_for_line(REGISTERED, timeout)
        if int(match.group(1)) != count:
            raise BenchError(f"the node registered {match.group(1)} objects, not {count}:\n"
                             f"{self.node.log}")
        return when

    def close(self) -> None:
        self.client.close()
        if self.node is not None:
            self.node.stop()
        self.master.stop()


def key_of(index: int) -> str:
    return f"scale/{index:010d}"


def put_objects(client: kvstored.Client, first: int, end: int, value: bytes,
                say: Callable[[str], None] | None = None) -> float:
    """Puts keys ``first..end-1`` and flushes them to SSD; returns objects per second."""
    started = time.perf_counter()
    step = max(FLUSH_EVERY, (end - first) // 10 // FLUSH_EVERY * FLUSH_EVERY)
    for start in range(first, end, PUT_BATCH):
        keys = [key_of(i) for i in range(start, min(end, start + PUT_BATCH))]
        stored = client.batch_put(keys, [value] * len(keys))
        if not all(stored):
            raise BenchError(f"{stored.count(False)} of {len(keys)} puts from {keys[0]} "
                             f"were refused (is --ssd large enough?)")
        if (start - first + PUT_BATCH) % FLUSH_EVERY == 0 or start + PUT_BATCH >= end:
            flushed = client.call("flush", wait=True, timeout=3600)
            if not flushed.get("done", False):
                raise BenchError(f"the flush to SSD did not finish: {flushed}")
            done = start + PUT_BATCH - first
            if say is not None and done % step == 0:
                say(f"  {first + done:,} objects put and flushed "
                    f"({done / (time.perf_counter() - started):.0f}/s)")
    return (end - first) / (time.perf_counter() - started)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_us": ordered[len(ordered) // 2] * 1e6,
            "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6}


def time_lookups(client: kvstored.Client, objects: int, seed: int) -> dict[str, Any]:
    """Single-key ``lookup`` and ``exists`` round trips to the master, random keys."""
    rng = np.random.default_rng(seed)
    figures: dict[str, Any] = {}
    for op in ("lookup", "exists"):
        samples = []
        for index in rng.integers(0, objects, LOOKUPS).tolist():
            started = time.perf_counter()
            reply = client.call(op, keys=[key_of(index)])
            samples.append(time.perf_counter() - started)
            if op == "exists" and reply.get("exists") not in (None, [True]):
                raise BenchError(f"{key_of(index)} is missing from the master")
        figures[op] = _percentiles(samples)
    return figures


def _client_process(address: str, token_file: str, objects: int, seconds: float, seed: int,
                    start: Any, results: Any) -> None:
    """One client process of the throughput phase: gets random keys until its time is up,
    after every process has connected (``start``, a barrier)."""
    rng = np.random.default_rng(seed)
    with kvstored.connect(address, transport="tcp", token_file=token_file) as client:
        keys = [key_of(i) for i in rng.integers(0, objects, 4096).tolist()]
        client.get(keys[0])  # connect to the node too before the clock starts
        start.wait()
        ops, misses, latencies = 0, 0, []
        deadline = time.perf_counter() + seconds
        while (now := time.perf_counter()) < deadline:
            if client.get(keys[ops % len(keys)]) is None:
                misses += 1
            ops += 1
            latencies.append(time.perf_counter() - now)
        results.put({"ops": ops, "misses": misses, "seconds": seconds,
                     "p50_us": statistics.median(latencies) * 1e6})


def run_clients(store: Store, processes: int, objects: int, seconds: float,
                seed: int) -> dict[str, Any]:
    assert store.master.address is not None
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(processes)
    results = context.Queue()
    workers = [context.Process(target=_client_process,
                               args=(store.master.address, str(store.token_file), objects,
                                     seconds, seed * 100 + k, start, results))
               for k in range(processes)]
    for worker in workers:
        worker.start()
    try:
        figures = [results.get(timeout=seconds + 120) for _ in workers]
    except Exception:
        raise BenchError(f"a client process of {processes} did not report") from None
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    total = sum(f["ops"] for f in figures)
    # A get of a stored key that misses is a finding, not a reason to drop the run: it
    # is counted and reported (the store answers a miss rather than wrong bytes).
    return {"ops_per_s": total / seconds, "per_process_ops_per_s": total / seconds / processes,
            "p50_us": statistics.median(f["p50_us"] for f in figures),
            "misses": sum(f["misses"] for f in figures), "gets": total}


def measure_metadata(work: Path, objects: int, value_size: int, rounds: int,
                     say: Callable[[str], None]) -> dict[str, Any]:
    """Phases 2 and 3 on a master whose objects an inventory node registered (see the
    module docstring), and the time that registration took."""
    store = Store(work, "none", dram=0, ssd=0, with_node=False)
    inventory = None
    try:
        assert store.master.address is not None
        host, port = store.master.address.rsplit(":", 1)
        inventory = InventoryNode((host, int(port)), read_token_file(store.node_token_file),
                                  "scale-inventory", key_of)
        rss_empty = store.master.rss()
        small = min(SMALL_TABLE, objects)
        inventory.register(small, value_size)
        lookups_small = [time_lookups(store.client, small, seed=r) for r in range(rounds)]
        say(f"metadata: registering {objects:,} objects' metadata ...")
        register_s = inventory.register(objects, value_size)
        status, master = _master_use(store, rss_empty)
        rss_full = master["rss_full"]
        if status["objects"] != objects:
            raise BenchError(f"the master holds {status['objects']:,} objects, not "
                             f"{objects:,}")
        say(f"metadata: registered in {register_s:.1f} s ({objects / register_s:.0f}/s); "
            f"master {master['bytes_per_object']:.0f} B per object "
            f"({format_size(rss_full)} resident)")
        lookups_full = [time_lookups(store.client, objects, seed=r) for r in range(rounds)]
        return {"mode": "metadata-only", "master": master,
                "register": {"seconds": register_s, "objects_per_s": objects / register_s},
                "lookup": {f"at_{small}": _median_of(lookups_small),
                           f"at_{objects}": _median_of(lookups_full)}}
    finally:
        if inventory is not None:
            inventory.close()
        store.close()


def _master_use(store: Store, rss_empty: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cluster's status now, and what the master's memory holds: resident bytes
    before (``rss_empty``) and now, objects and replicas, bytes per object."""
    status = store.status()
    rss_full = store.master.rss()
    return status, {"rss_empty": rss_empty, "rss_full": rss_full,
                    "objects": status["objects"],
                    "replicas": {tier: status["tiers"][tier]["objects"]
                                 for tier in ("dram", "ssd")},
                    "bytes_per_object": (rss_full - rss_empty) / status["objects"]}


def _median_of(rounds: list[Any]) -> Any:
    """The median of each number over rounds of like-shaped dicts."""
    first = rounds[0]
    if isinstance(first, dict):
        return {key: _median_of([r[key] for r in rounds]) for key in first}
    return statistics.median(rounds)


def measure_backend(backend: str, work: Path, objects: int, value_size: int, rounds: int,
                    clients: list[int], seconds: float,
                    say: Callable[[str], None]) -> dict[str, Any]:
    value = np.random.default_rng(7).bytes(value_size)
    # A limit, not an allocation: far above what the objects take, so that no backend
    # evicts any (the bucket backend takes about 8 KiB per 256-byte object).
    ssd = max(1 << 30, objects * (value_size + SSD_PER_OBJECT) * 4)
    store = Store(work, backend, dram=DRAM, ssd=ssd)
    try:
        rss_empty = store.master.rss()
        small = min(SMALL_TABLE, objects)
        put_objects(store.client, 0, small, value)
        lookups_small = [time_lookups(store.client, small, seed=r) for r in range(rounds)]
        say(f"{backend}: putting {objects:,} objects of {value_size} B ...")
        put_rate = put_objects(store.client, small, objects, value, say) if objects > small else 0.0
        status, master = _master_use(store, rss_empty)
        rss_full = master["rss_full"]
        disk = allocated_bytes(work / "data")
        store_disk = {"bytes": disk, "bytes_per_object": disk / max(1, status["objects"])}
        say(f"{backend}: master {master['bytes_per_object']:.0f} B per object "
            f"({format_size(rss_full)} resident at {status['objects']:,} objects); "
            f"store on disk {format_size(disk)}, {store_disk['bytes_per_object']:.0f} B "
            f"per object")
        lookups_full = [time_lookups(store.client, objects, seed=r) for r in range(rounds)]
        recoveries = []
        for r in range(rounds):
            assert store.node is not None
            store.node.stop()
            node = store.start_node()
            registered = store.wait_registered(objects, timeout=3600)
            recoveries.append(registered - node.started)
            say(f"{backend}: recovery round {r + 1}/{rounds}: {recoveries[-1]:.2f} s")
        client_figures: dict[str, Any] = {}
        for processes in clients:
            per_round = [run_clients(store, processes, objects, seconds, seed=r)
                         for r in range(rounds)]
            client_figures[str(processes)] = {"rounds": per_round, "median": _median_of(per_round)}
            misses = sum(r["misses"] for r in per_round)
            say(f"{backend}: {processes} client process(es): "
                f"{client_figures[str(processes)]['median']['ops_per_s']:.0f} gets/s"
                + (f"; WARNING: {misses} gets of stored keys missed" if misses else ""))
        return {"put_objects_per_s": put_rate, "master": master, "disk": store_disk,
                "lookup": {f"at_{small}": _median_of(lookups_small),
                           f"at_{objects}": _median_of(lookups_full)},
                "recovery": {"rounds_s": recoveries, "median_s": statistics.median(recoveries),
                             "objects": objects, "empty_start_s": store.empty_start_s},
                "clients": client_figures}
    finally:
        store.close()


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _table(report: dict[str, Any]) -> str:
    lines = []
    for backend, r in report["backends"].items():
        lookups = " ".join(f"{at}: lookup p50 {f['lookup']['p50_us']:.0f} us "
                           f"exists p50 {f['exists']['p50_us']:.0f} us"
                           for at, f in r["lookup"].items())
        if r.get("mode") == "metadata-only":
            lines.append(f"{backend}: {r['master']['bytes_per_object']:.0f} B/object in the "
                         f"master; {lookups}; registration {r['register']['seconds']:.1f} s")
            continue
        clients = ", ".join(f"{n}: {c['median']['ops_per_s']:.0f}/s"
                            for n, c in r["clients"].items())
        lines.append(f"{backend}: {r['master']['bytes_per_object']:.0f} B/object in the "
                     f"master; {lookups}; recovery {r['recovery']['median_s']:.2f} s; "
                     f"gets by client processes {clients}")
    return "\n".join(lines)


@click.command("scale")
@click.option("--objects", default=1_000_000, show_default=True, type=click.IntRange(1),
              help="Objects in the store.")
@click.option("--value-size", default="256B", show_default=True, help="Bytes per object.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True,
              help="Comma-separated SSD backends, each measured on a fresh store.")
@click.option("--clients", default="1,2,4", show_default=True,
              help="Comma-separated counts of client processes.")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds per client phase and round.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds of the latency, recovery and client phases; medians reported.")
@click.option("--dir", "work_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the stores' data goes [default: a temporary directory, removed].")
@click.option("--metadata-only", is_flag=True,
              help="No node and no values: register the objects' metadata with the master "
                   "as a recovering node does, and measure the master alone (memory, "
                   "lookups, registration).")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench-results/scale.json"), show_default=True)
def scale_command(objects: int, value_size: str, backends: str, clients: str, seconds: float,
                  rounds: int, work_dir: Path | None, metadata_only: bool,
                  json_out: Path) -> None:
    """The master's memory per object and lookup latency, a node's recovery time, and
    throughput by client processes, at --objects objects on one store.

    Exit code 1 when a store fails or the machine cannot hold the run. Each backend's
    store is removed once measured, so --dir needs room for one store at a time.
    """
    try:
        value_bytes = parse_size(value_size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--value-size") from None
    if value_bytes < 1:
        raise click.BadParameter("at least 1 byte", param_hint="--value-size")
    try:
        client_counts = [int(n) for n in clients.split(",") if n.strip()]
    except ValueError:
        raise click.BadParameter(f"{clients!r} is not a list of counts",
                                 param_hint="--clients") from None
    if not client_counts or min(client_counts) < 1:
        raise click.BadParameter("name at least one count, each >= 1", param_hint="--clients")
    backend_names = [b.strip() for b in backends.split(",") if b.strip()]
    if not backend_names:
        raise click.BadParameter("name at least one backend", param_hint="--backends")
    needed = objects * (METADATA_BUDGET_PER_OBJECT if metadata_only else BUDGET_PER_OBJECT)
    allowed = min(MEMORY_CAP, _available_memory() // 2)
    if needed > allowed:
        raise BenchError(f"{objects:,} objects may need {format_size(needed)} of memory; this "
                         f"run may use {format_size(allowed)} (half of what is free, at most "
                         f"{format_size(MEMORY_CAP)}). Use fewer --objects and extrapolate.")
    temporary = None
    if work_dir is None:
        temporary = Path(tempfile.mkdtemp(prefix="kvstored-bench-scale-"))
        work_dir = temporary
    work_dir.mkdir(parents=True, exist_ok=True)
    disk_needed = 0 if metadata_only else objects * (value_bytes + SSD_PER_OBJECT)
    if shutil.disk_usage(work_dir).free < disk_needed:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise BenchError(f"{work_dir} has {format_size(shutil.disk_usage(work_dir).free)} "
                         f"free; {objects:,} objects may take {format_size(disk_needed)}. "
                         f"Pass --dir elsewhere or fewer --objects.")
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    if metadata_only:
        backend_names = ["metadata-only"]
    try:
        for backend in backend_names:
            work = work_dir / backend
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
            results[backend] = (
                measure_metadata(work, objects, value_bytes, rounds, say) if metadata_only
                else measure_backend(backend, work, objects, value_bytes, rounds,
                                     client_counts, seconds, say))
            shutil.rmtree(work, ignore_errors=True)  # the next backend needs the room
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    report = {
        "benchmark": "scale",
        "command": (f"kvstore bench scale --objects {objects} --value-size {value_size} "
                    + ("--metadata-only " if metadata_only else
                       f"--backends {','.join(backend_names)} --clients {clients} "
                       f"--seconds {seconds:g} ")
                    + f"--rounds {rounds}"),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "python": platform.python_version(),
                    "memory_available": _available_memory()},
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "objects": objects, "value_size": value_bytes, "rounds": rounds,
        "backends": results,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(_table(report))
    click.echo(f"results: {json_out}")
