"""Stopping a child process the way kvstored's own processes expect to be stopped.

A kvstored role, a peer of a benchmark or a FUSE mount stops cleanly on SIGTERM (a node
first writes its DRAM-only objects to SSD); one that ignores it for too long is killed,
so that a run never leaves a process behind. This module imports nothing of kvstored.
"""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen, timeout: float) -> bool:
    """SIGTERM ``proc`` (unless it has exited) and wait at most ``timeout`` seconds for
    it; kill it if it is still running then. True when it exited by itself."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    return True
