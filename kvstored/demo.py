"""``make demo``: the main job on the embedded default, end to end, in about a minute.

1. Start ``kvstored up`` (master and node in one process, default backend) on a scratch
   data directory.
2. Write KV blocks through the client; they land in DRAM and are offloaded to SSD.
3. Flush, evict half of them from DRAM, and read everything back: from both tiers.
4. Stop the daemon (SIGTERM) and start it again: every block is still there.
5. Damage one record on disk: it reads as a miss, never as bad bytes, and
   ``kvstore recover --repair`` quarantines it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

import kvstored
from kvstored.config import load_config
from kvstored.protocol import ReplicaState
from kvstored.sdk.testing import payload

console = Console(width=max(120, shutil.get_terminal_size().columns))
BIN = Path(sys.executable).parent
BANNER = re.compile(r"^kvstored up: listening on ([\d.]+:\d+)")


def start(data: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([str(BIN / "kvstored"), "up", "--listen", "127.0.0.1:0",
                             "--data", str(data), "--dram", "256MiB", "--ssd", "2GiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stdout:
        if line.startswith("kvstored up:"):
            console.print(f"[dim]{line.rstrip()}[/]")
        match = BANNER.match(line)
        if match:
            # Keep draining its log so the daemon never blocks on a full pipe.
            import threading

            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, match.group(1)
    raise SystemExit(f"kvstored up did not start (exit {proc.wait()})")


def kvstore(master: str, *args: str) -> subprocess.CompletedProcess:
    console.print(f"[bold cyan]$ kvstore {' '.join(args)}[/]")
    run = subprocess.run([str(BIN / "kvstore"), *args], text=True, capture_output=True,
                         env={**os.environ, "KVSTORE_MASTER": master, "COLUMNS": "120"})
    console.print(run.stdout.rstrip() or run.stderr.rstrip())
    return run


def tiers_of(client, key: str) -> str:
    info = client.stat(key)
    return "+".join(sorted(r.tier for r in info.replicas if r.state is ReplicaState.COMPLETE))


def main() -> int:
    data = Path(tempfile.mkdtemp(prefix="kvstored-demo-"))
    keys = [f"model=glm-5.1/prefix-{i // 16:02d}/block-{i:04d}" for i in range(64)]
    blocks = {k: payload(k, 256 * 1024) for k in keys}
    ok = True
    console.rule("[bold]1. start the embedded store")
    proc, master = start(data)
    console.print(f"[dim]clients prove who they are with the token the daemon keeps in "
                  f"{load_config()['security.token_file']} (mode 0600); kvstore and "
                  "kvstored.connect read it from there (docs/security.md)[/]")
    try:
        console.rule("[bold]2. write 64 KV blocks of 256 KiB")
        with kvstored.connect(master) as c:
            assert all(c.batch_put(keys, list(blocks.values())))
            console.print(f"wrote {len(keys)} blocks; first block is in: {tiers_of(c, keys[0])}")
            console.rule("[bold]3. flush to SSD, evict half from DRAM, read both tiers")
            kvstore(master, "flush", "--wait")
            for prefix in ("model=glm-5.1/prefix-00/", "model=glm-5.1/prefix-01/"):
                kvstore(master, "evict", "--tier", "dram", "--prefix", prefix)
            deadline = time.monotonic() + 15
            while tiers_of(c, keys[0]) != "ssd" and time.monotonic() < deadline:
                time.sleep(0.1)  # the DRAM copy goes once its read leases expire
            got = c.batch_get(keys)
            intact = sum(g == blocks[k] for k, g in zip(keys, got))
            console.print(f"read back {intact}/{len(keys)} blocks byte for byte; "
                          f"{keys[0]} is in {tiers_of(c, keys[0])}, "
                          f"{keys[-1]} is in {tiers_of(c, keys[-1])}")
            ok &= intact == len(keys)
        kvstore(master, "status")
        console.rule("[bold]4. restart the daemon")
        proc.terminate()
        proc.wait(30)
        proc, master = start(data)
        with kvstored.connect(master) as c:
            got = c.batch_get(keys)
            intact = sum(g == blocks[k] for k, g in zip(keys, got))
            console.print(f"after the restart: {intact}/{len(keys)} blocks intact")
            ok &= intact == len(keys)
            console.rule("[bold]5. damage one record on disk")
            victim = keys[5]
            ssd = next(iter(c.locate(victim).values()))["ssd"]
            console.print(f"{victim} is at {ssd['path']} offset {ssd['offset']}")
            with open(ssd["path"], "r+b") as f:
                f.seek(ssd["offset"] + 4096)
                f.write(b"\xde\xad\xbe\xef")
            # Read it from SSD (its DRAM copy was dropped by the restart).
            value = c.get(victim)
            console.print(f"reading the damaged block gives: {value!r:.40}  (a miss, "
                          "never bad bytes)")
            ok &= value is None
        console.print("the node quarantined the record on its own; the status shows it, and "
                      "a full rescan finds nothing left to fix:")
        time.sleep(1)
        kvstore(master, "status")
        kvstore(master, "recover", "--repair")
    finally:
        proc.terminate()
        proc.wait(30)
    if ok:
        console.print(f"[green bold]demo ok[/] (scratch data in {data})")
        shutil.rmtree(data, ignore_errors=True)
        return 0
    console.print(f"[red bold]demo failed[/] (data kept in {data})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
