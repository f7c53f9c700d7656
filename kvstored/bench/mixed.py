"""``kvstore bench mixed``: kvstored under a mixed, multi-threaded load, with eviction and
offload running underneath.

``--threads`` threads (8) share one blocking client and, for ``--seconds``, each run a
random mix on keys of its own:

=========  =====  ===========================================================
operation  share  what
=========  =====  ===========================================================
put        40 %   a new key, a value of ``--min-size`` to ``--max-size`` bytes
get        40 %   one of the thread's keys, its bytes checked
remove     10 %   one of the thread's keys
exists     10 %   ``batch_exists`` of up to 8 of the thread's keys
=========  =====  ===========================================================

The store is one ``kvstored up`` child (eager offload, a ``--dram`` tier far smaller than
what the run writes, so that DRAM eviction and offloads run all along), or an existing
cluster given with ``--master``. The JSON holds operations per second, per operation the
count and latency percentiles, the errors (a wrong value or a failed call is an error),
and the daemon's CPU time. There is no peer to run beside it: docs/benchmarks.md
compares the figure across commits on one machine. The random mix is seeded
(``--seed``) and the seed is in the JSON.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

import kvstored
from kvstored.bench.store_kvstored import KvstoredDaemon
from kvstored.errors import StoreError
from kvstored.sdk.units import parse_size

OPS = ("put", "get", "remove", "exists")
WEIGHTS = (0.4, 0.4, 0.1, 0.1)


class _Worker:
    """One thread's share of the load: its own keys, its own seeded generator."""

    def __init__(self, client: kvstored.Client, index: int, seed: int, sizes: tuple[int, int],
                 stop: threading.Event) -> None:
        self.client = client
        self.index = index
        self.rng = random.Random(seed * 1000 + index)
        self.prefix = f"mixed-{seed}"  # each round (seed) writes keys of its own
        self.sizes = sizes
        self.stop = stop
        self.latencies: dict[str, list[float]] = {op: [] for op in OPS}
        self.errors: list[str] = []
        self.keys: dict[str, int] = {}  # key -> its value's seed (the bytes are derived)
        self._next = 0
        # One random block per thread; a value is a slice of it, so no generation cost
        # lands in the measured calls.
        self.block = os.urandom(2 * sizes[1])

    def _value(self, seed: int) -> memoryview:
        size = random.Random(seed).randint(*self.sizes)
        start = seed % self.sizes[1]
        return memoryview(self.block)[start:start + size]

    def run(self) -> None:
        while not self.stop.is_set():
            op = self.rng.choices(OPS, WEIGHTS)[0] if self.keys else "put"
            started = time.perf_counter()
            try:
                self._one(op)
            except StoreError as exc:
                self.errors.append(f"{op}: {type(exc).__name__}: {exc}")
            self.latencies[op].append(time.perf_counter() - started)

    def _one(self, op: str) -> None:
        if op == "put":
            key = f"{self.prefix}/t{self.index}/{self._next}"
            seed = self.rng.getrandbits(32)
            self._next += 1
            if not self.client.put(key, self._value(seed)):
                self.errors.append(f"put {key}: the key already existed")
            self.keys[key] = seed
        elif op == "get":
            key = self.rng.choice(list(self.keys))
            got = self.client.get(key)
            if got is None:  # eviction offloads a last copy first: nothing may vanish
                self.errors.append(f"get {key}: missing")
            elif got != self._value(self.keys[key]):
                self.errors.append(f"get {key}: wrong bytes")
        elif op == "remove":
            key = self.rng.choice(list(self.keys))
            del self.keys[key]
            if not self.client.remove(key):
                self.errors.append(f"remove {key}: missing")
        else:
            keys = self.rng.sample(list(self.keys), min(8, len(self.keys)))
            if self.client.batch_exists(keys) != [True] * len(keys):
                self.errors.append("batch_exists: a key was missing")


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6  # noqa: E731
    return {"count": len(values), "p50_us": round(pick(0.5), 1), "p99_us": round(pick(0.99), 1),
            "mean_us": round(statistics.fmean(values) * 1e6, 1)}


def run_mixed(address: str, *, threads: int, seconds: float, sizes: tuple[int, int],
              seed: int, transport: str, pid: int | None = None) -> dict[str, Any]:
    """Drive the store at ``address``; the results document (without the set-up)."""
    stop = threading.Event()
    with kvstored.connect(address, transport=transport, timeout=120) as client:
        workers = [_Worker(client, i, seed, sizes, stop) for i in range(threads)]
        pool = [threading.Thread(target=w.run, name=f"mixed-{i}")
                for i, w in enumerate(workers)]
        cpu_before = _cpu_seconds(pid) if pid else None
        started = time.perf_counter()
        for thread in pool:
            thread.start()
        stop.wait(seconds)
        stop.set()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - started
        cpu = _cpu_seconds(pid) - cpu_before if pid and cpu_before is not None else None
        status = client.call("status")
    per_op = {op: _percentiles([x for w in workers for x in w.latencies[op]]) for op in OPS}
    total = sum(p["count"] for p in per_op.values())
    errors = [e for w in workers for e in w.errors]
    return {"ops_per_s": round(total / elapsed, 1), "operations": total,
            "daemon_cpu_ms_per_op": round(1000 * cpu / total, 3) if cpu is not None else None,
            "seconds": round(elapsed, 2), "ops": per_op, "errors": len(errors),
            "first_errors": errors[:10],
            "daemon_cpu_percent": round(100 * cpu / elapsed, 1) if cpu is not None else None,
            "tiers_after": status["tiers"]}


@click.command(name="mixed")
@click.option("--threads", type=int, default=8, show_default=True)
@click.option("--seconds", type=float, default=20.0, show_default=True,
              help="How long each round runs.")
@click.option("--rounds", type=int, default=1, show_default=True,
              help="Rounds on one store; the JSON keeps each and the median.")
@click.option("--min-size", default="1KiB", show_default=True)
@click.option("--max-size", default="256KiB", show_default=True)
@click.option("--dram", default="64MiB", show_default=True,
              help="DRAM tier of the store this starts (small, so eviction runs).")
@click.option("--ssd", default="8GiB", show_default=True)
@click.option("--backend", default="bucket", show_default=True)
@click.option("--transport", type=click.Choice(["tcp", "shm", "auto"]), default="tcp",
              show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--master", "master_address", metavar="HOST:PORT",
              help="Drive this running store instead of starting one.")
@click.option("--daemon-pid", type=int, metavar="PID",
              help="With --master: the store's process, to report its CPU time.")
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Where the store keeps its data and log (default: a temporary directory, "
                   "removed afterwards).")
@click.option("--json-out", type=click.Path(dir_okay=False), help="Write the JSON here.")
def mixed_command(threads, seconds, rounds, min_size, max_size, dram, ssd, backend, transport,
                  seed, master_address, daemon_pid, workdir, json_out) -> None:
    """Mixed put/get/remove/exists from many threads, with eviction and offload running."""
    sizes = (parse_size(min_size), parse_size(max_size))
    daemon = None
    scratch = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="kvstored-bench-mixed-"))
    if master_address is None:
        daemon = KvstoredDaemon(workdir / "data", parse_size(dram), parse_size(ssd),
                                backend, offload="eager")
        address, pid = daemon.address, daemon.proc.pid
    else:
        address, pid = master_address, daemon_pid
    try:
        results = []
        for number in range(rounds):
            click.echo(f"round {number + 1}/{rounds}: {threads} threads for {seconds:g}s ...",
                       err=True)
            results.append(run_mixed(address, threads=threads, seconds=seconds, sizes=sizes,
                                     seed=seed + number, transport=transport, pid=pid))
            click.echo(f"  {results[-1]['ops_per_s']} ops/s, {results[-1]['errors']} errors",
                       err=True)
    finally:
        if daemon is not None:
            daemon.stop()
        if scratch:
            shutil.rmtree(workdir, ignore_errors=True)
    document = {
        "benchmark": "mixed", "command": " ".join(["kvstore", "bench", "mixed", *sys.argv[3:]]),
        "config": {"threads": threads, "seconds": seconds, "sizes": list(sizes),
                   "dram": dram, "backend": backend, "transport": transport, "seed": seed,
                   "store": master_address or "kvstored up (eager offload)"},
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "load_average": os.getloadavg()},
        "median_ops_per_s": statistics.median(r["ops_per_s"] for r in results),
        "rounds": results}
    text = json.dumps(document, indent=2)
    if json_out:
        Path(json_out).write_text(text + "\n")
    click.echo(text)
    if any(r["errors"] for r in results):
        sys.exit(1)
