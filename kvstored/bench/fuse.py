"""``kvstore bench fuse``: reading one big object through ``kvstore mount`` against
reading it through the client library, side by side in one run.

A ``kvstored up`` child process (bucket backend) holds one object of ``--size`` bytes
(256 MiB by default). Two mounts of it run as ``kvstore mount`` child processes: the
default one (``--direct-io``) and one with ``--page-cache`` (``keep_cache``). Each round
reads the whole object:

==========================  ===========================================================
runner                      what it is
==========================  ===========================================================
client                      ``Client.get_into`` into a reused buffer (what the mount
                            itself calls; a same-host DRAM object is copied out of the
                            mapped segment): the ratios' reference
client-tcp                  the same over TCP (``transport="tcp"``), as a client on
                            another host reads
direct-io-<R>               the default mount: every read() one FUSE request, after a
                            fetch of the object at open
page-cache-cold-<R>         the page-cache mount, cached pages dropped first
                            (``POSIX_FADV_DONTNEED``), ``read()`` of R bytes at a time:
                            open, fetch and every FUSE request
page-cache-warm-<R>         the same file read again at once: from the page cache
==========================  ===========================================================

R is 128 KiB and 1 MiB. The ratio of each runner's median to the client's is the
figure docs/fuse.md quotes. Every mount read is checked against the object's bytes
once per runner.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

import kvstored
from kvstored.bench import BenchError, RunStart
from kvstored.capabilities import probe_fuse
from kvstored.errors import UnavailableError
from kvstored.fuse.names import key_to_name
from kvstored.processes import stop_process
from kvstored.sdk.units import format_size, parse_size

KiB, MiB = 1 << 10, 1 << 20
READ_SIZES = (128 * KiB, MiB)
KEY = "bench/fuse-object"
BIN = Path(sys.executable).parent


def _start_store(home: Path, size: int) -> tuple[subprocess.Popen, str]:
    room = f"{(2 * size + 256 * MiB) // MiB}MiB"
    proc = subprocess.Popen(
        [str(BIN / "kvstored"), "up", "--listen", "127.0.0.1:0", "--data", str(home / "data"),
         "--dram", room, "--ssd", room, "--backend", "bucket"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=home)
    lines = []
    output = proc.stdout
    assert output is not None  # stdout=PIPE
    for line in output:
        lines.append(line)
        found = re.search(r"^kvstored up: listening on ([\d.]+:\d+)", line)
        if found:
            return proc, found.group(1)
    raise BenchError("kvstored up did not start:\n" + "".join(lines[-20:]))


def _mounted(path: Path) -> bool:
    target = os.fsencode(os.path.realpath(path))
    with open("/proc/self/mountinfo", "rb") as mounts:
        return any(line.split()[4] == target for line in mounts)


def _mount(path: Path, master: str, *extra: str) -> subprocess.Popen:
    path.mkdir()
    proc = subprocess.Popen([str(BIN / "kvstore"), "mount", str(path), "--master", master,
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr
    assert stderr is not None  # stderr=PIPE
    deadline = time.monotonic() + 60
    while not _mounted(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise BenchError(f"kvstore mount {path} did not mount: "
                             f"{stderr.read().decode(errors='replace')}")
        time.sleep(0.05)
    return proc


def _read_file(path: Path, buffer: memoryview, chunk: int, drop_cache: bool) -> float:
    """Seconds to read the whole file into ``buffer``, ``chunk`` bytes per read()."""
    started = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop_cache:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.perf_counter()
        done = 0
        while True:
            got = os.readv(fd, [buffer[done:done + chunk]])
            if not got:
                break
            done += got
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    if done != len(buffer):
        raise BenchError(f"{path}: read {done} bytes, expected {len(buffer)}")
    return elapsed


@click.command("fuse")
@click.option("--size", default="256MiB", show_default=True, help="The object's size.")
@click.option("--rounds", default=5, show_default=True, type=click.IntRange(1))
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench-results/fuse.json"), show_default=True)
def fuse_command(size: str, rounds: int, json_out: Path) -> None:
    """One big object read through `kvstore mount` (--direct-io and --page-cache) against
    the client library; writes every round, the medians and the ratios to --json-out."""
    run = RunStart()
    available, reason = probe_fuse()
    if not available:
        raise UnavailableError(f"FUSE is unavailable: {reason}")
    try:
        size_bytes = parse_size(size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--size") from None
    home = Path(tempfile.mkdtemp(prefix="kvstored-bench-fuse-"))
    procs: list[subprocess.Popen] = []
    seconds: dict[str, list[float]] = {}
    try:
        store, master = _start_store(home, size_bytes)
        procs.append(store)
        value = np.random.default_rng(1).integers(0, 256, size_bytes, dtype=np.uint8)
        buffer = np.zeros(size_bytes, dtype=np.uint8)
        with kvstored.connect(master) as client, \
                kvstored.connect(master, transport="tcp") as tcp_client:
            client.put(KEY, value)
            mounts = {"page-cache": home / "page-cache", "direct-io": home / "direct-io"}
            procs.append(_mount(mounts["direct-io"], master))
            procs.append(_mount(mounts["page-cache"], master, "--page-cache"))
            checked: set[str] = set()
            name_of_key = os.fsdecode(key_to_name(KEY))
            view = memoryview(buffer)
            for number in range(rounds):
                timings = {}
                started = time.perf_counter()
                assert client.get_into(KEY, buffer) == size_bytes
                timings["client"] = time.perf_counter() - started
                started = time.perf_counter()
                assert tcp_client.get_into(KEY, buffer) == size_bytes
                timings["client-tcp"] = time.perf_counter() - started
                for chunk in READ_SIZES:
                    tag = format_size(chunk).replace(" ", "")
                    cache_file = mounts["page-cache"] / "keys" / name_of_key
                    direct_file = mounts["direct-io"] / "keys" / name_of_key
                    runs = ((f"direct-io-{tag}", direct_file, False),
                            (f"page-cache-cold-{tag}", cache_file, True),
                            (f"page-cache-warm-{tag}", cache_file, False))
                    for name, path, cold in runs:
                        buffer[:] = 0
                        timings[name] = _read_file(path, view, chunk, drop_cache=cold)
                        if name not in checked:
                            if not np.array_equal(buffer, value):
                                raise BenchError(f"{name}: the bytes read differ from the "
                                                 "object's")
                            checked.add(name)
                for name, elapsed in timings.items():
                    seconds.setdefault(name, []).append(elapsed)
                click.echo(f"round {number + 1}/{rounds}: " + ", ".join(
                    f"{n} {size_bytes / t / 1e9:.2f}" for n, t in timings.items()) + " GB/s",
                    err=True)
    finally:
        for proc in reversed(procs):
            stop_process(proc, 30)
        shutil.rmtree(home, ignore_errors=True)
    results = _summarise(seconds, size_bytes)
    report: dict[str, Any] = {
        **run.header("fuse", f"kvstore bench fuse --size {size} --rounds {rounds}"),
        "size": size_bytes, "rounds": rounds, "results": results,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(f"{'runner':<24} {'median GB/s':>12} {'vs client':>10}")
    for name, r in results.items():
        click.echo(f"{name:<24} {r['median_gb_per_s']:>12.2f} {r['ratio_to_client']:>9.2f}x")
    click.echo(f"results: {json_out}")


def _summarise(seconds: dict[str, list[float]], size: int) -> dict[str, Any]:
    medians = {name: size / statistics.median(t) / 1e9 for name, t in seconds.items()}
    return {name: {"rounds_gb_per_s": [round(size / s / 1e9, 3) for s in t],
                   "median_gb_per_s": round(medians[name], 3),
                   "ratio_to_client": round(medians[name] / medians["client"], 3)}
            for name, t in seconds.items()}
