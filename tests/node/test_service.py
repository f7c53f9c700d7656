"""The node's own background loop (the reaper of abandoned puts) under its supervisor:
a failure is counted and the loop goes on."""

from __future__ import annotations

import trio
import trio.testing

from kvstored.node.service import Node


def test_the_reaper_survives_failures_and_keeps_reclaiming(dram, tmp_path):
    node = Node(data_dir=tmp_path, dram=1 << 20, ssd=1 << 20, backend="file-per-key",
                master=("127.0.0.1", 1), name="n1")
    node.dram = dram
    dram.allocate("abandoned", 4096, 1, timeout=0)  # expires at once
    calls = []
    real = dram.expire_uncommitted

    def flaky(now: float) -> list[str]:
        calls.append(now)
        if len(calls) <= 2:
            raise OSError("injected")
        return real(now)

    dram.expire_uncommitted = flaky

    async def main() -> None:
        with trio.move_on_after(20):
            await node.supervisor.forever("reaper", node._reap)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(calls) > 5
    assert node.metrics.background_errors.labels(task="reaper")._value.get() == 2
    assert dram.being_written("abandoned") is None and dram.used == 0
