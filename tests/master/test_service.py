"""The master's ops in-process: placement refuses objects no node can ever hold, nodes
that leave are forgotten at once, offload failures the node retries stay queued, a
flush reports only what still fails, and housekeeping survives its own failures."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from kvstored.errors import NoSpaceError
from kvstored.master.policy import PolicyConfig
from kvstored.master.service import Master
from kvstored.master.table import SSD
from kvstored.protocol import OffloadFailed, OffloadFailure

MiB = 1 << 20


def _run(coro_fn, *args):
    return trio.run(coro_fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def _master(**policy) -> Master:
    return Master(policy=PolicyConfig(**policy), node_ttl=10.0)


async def _register(master: Master, name: str, *, dram: int = 64 * MiB,
                    max_value: int = 8 * MiB) -> None:
    await master.op_register(None, {"info": {
        "node": name, "address": ["127.0.0.1", 1], "host": "h", "segment": "s", "token": "00",
        "dram_capacity": dram, "ssd_capacity": 1 << 30, "backend": "bucket",
        "max_value_size": max_value}})
    await master.op_register_done(None, {"node": name})


def test_put_target_refuses_objects_no_node_can_hold_and_reserves_nothing():
    async def main() -> None:
        master = _master()
        await _register(master, "n1", dram=64 * MiB, max_value=8 * MiB)
        await _register(master, "n2", dram=32 * MiB, max_value=16 * MiB)
        with pytest.raises(NoSpaceError, match=r"80\.0 MiB.*whole DRAM tier.*64\.0 MiB"):
            await master.op_put_target(None, {"keys": ["a", "huge"], "sizes": [1, 80 * MiB]})
        with pytest.raises(NoSpaceError, match=r"40\.0 MiB.*8\.0 MiB.*max_value_size"):
            await master.op_put_target(None, {"keys": ["big"], "sizes": [40 * MiB]})
        assert master.table.pending == {}  # the batch was refused whole
        # 12 MiB fits only n2's backend: it goes there, though n1 has more DRAM free.
        reply, _ = await master.op_put_target(None, {"keys": ["mid"], "sizes": [12 * MiB]})
        assert reply["targets"] == ["n2"]

    _run(main)


def test_a_dram_only_store_takes_what_fits_in_dram():
    async def main() -> None:
        master = _master(dram_only=True)
        await _register(master, "n1", dram=64 * MiB, max_value=8 * MiB)
        reply, _ = await master.op_put_target(None, {"keys": ["k"], "sizes": [40 * MiB]})
        assert reply["targets"] == ["n1"]

    _run(main)


def test_a_leaving_node_takes_no_puts_and_an_unregistered_one_is_gone_at_once():
    async def main() -> None:
        master = _master()
        await _register(master, "n1")
        await _register(master, "n2")
        await master.op_commit(None, {"node": "n1", "objects": [["k", 10, 7, 0]]})
        await master.op_leaving(None, {"node": "n1"})
        for _ in range(5):
            reply, _ = await master.op_put_target(None, {"keys": ["x"], "sizes": [1]})
            assert reply["targets"] in (["n2"], [None])
        found, _ = await master.op_lookup(None, {"keys": ["k"]})
        assert found["objects"][0] is not None  # still served while it flushes
        reply, _ = await master.op_unregister(None, {"node": "n1"})
        assert reply["dropped"] == 1
        assert "n1" not in master.nodes
        found, _ = await master.op_lookup(None, {"keys": ["k"]})
        assert found["objects"] == [None]
        master.table.check()

    _run(main)


def test_retried_offload_failures_stay_queued_and_flush_reports_only_what_still_fails():
    async def main() -> None:
        master = _master(offload="watermark")
        await _register(master, "n1")
        await master.op_commit(None, {"node": "n1", "objects": [
            ["a", 10, 1, 0], ["b", 10, 2, 4096], ["c", 10, 3, 8192]]})
        node = master.nodes["n1"]
        results: dict = {}

        async def flush() -> None:
            results["flush"], _ = await master.op_flush(None, {"wait": True, "timeout": 60})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            await trio.testing.wait_all_tasks_blocked()  # the flush waits
            assert {t["t"] for t in node.tasks} == {"offload"}
            full = OffloadFailure.NO_SPACE
            await master.op_heartbeat(None, {"node": "n1", "stats": {}, "done": {
                "offloaded": [["a", 1]],
                "offload_failed": [OffloadFailed("b", full, "disk full").to_wire(),
                                   OffloadFailed("c", OffloadFailure.TOO_LARGE,
                                                 "too large").to_wire()]}})
        assert results["flush"]["failed"] == [["b", "disk full"], ["c", "too large"]]
        assert node.offload_queued == {"b"}  # the node retries b itself; c is final
        assert master.table.objects["a"].replica("n1", SSD) is not None

        # A second flush names b again (the node then retries at once); it lands.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            await trio.testing.wait_all_tasks_blocked()  # the flush waits
            task = [t for t in node.tasks if t["t"] == "offload"][-1]
            assert "b" in task["keys"]
            await master.op_heartbeat(None, {"node": "n1", "stats": {}, "done": {
                "offloaded": [["b", 2]]}})
            await trio.testing.wait_all_tasks_blocked()  # the flush took b in, waits for c
            await master.op_heartbeat(None, {"node": "n1", "stats": {}, "done": {
                "offload_failed": [OffloadFailed("c", OffloadFailure.TOO_LARGE,
                                                 "too large").to_wire()]}})
        assert results["flush"]["failed"] == [["c", "too large"]]
        assert node.offload_queued == set()
        master.table.check()

    _run(main)


def test_housekeeping_survives_a_failing_pass(monkeypatch):
    async def main() -> None:
        master = _master()
        await _register(master, "n1")
        real = master.table.expire_pending
        calls = []

        def flaky(now: float):
            calls.append(now)
            if len(calls) <= 2:
                raise RuntimeError("injected")
            return real(now)

        monkeypatch.setattr(master.table, "expire_pending", flaky)
        # Silent for longer than node_ttl: the first pass that gets through kills it.
        master.nodes["n1"].last_heartbeat -= 100
        with trio.move_on_after(30):
            await master.run_housekeeping()
        assert len(calls) > 10
        assert master.metrics.background_errors.labels(task="housekeeping")._value.get() == 2
        assert not master.nodes["n1"].alive

    _run(main)


def test_register_tells_the_node_whether_the_store_is_dram_only():
    async def main() -> None:
        for dram_only in (False, True):
            master = _master(dram_only=dram_only)
            reply, _ = await master.op_register(None, {"info": {
                "node": "n1", "address": ["h", 1], "host": "h", "segment": "s", "token": "0",
                "dram_capacity": MiB, "ssd_capacity": MiB}})
            assert reply["dram_only"] is dram_only

    _run(main)



def test_a_recovery_waiting_for_a_node_that_leaves_returns_at_once():
    async def main() -> None:
        master = _master()
        await _register(master, "n1")
        await _register(master, "n2")
        results: dict = {}

        async def recover() -> None:
            results["recover"], _ = await master.op_recover(None, {"timeout": 3600})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(recover)
            await trio.testing.wait_all_tasks_blocked()  # the recovery waits on n1 and n2
            await master.op_heartbeat(None, {"node": "n2", "stats": {}, "done": {
                "recovered": [{"id": 1, "repaired": False, "records_checked": 3,
                               "problems": []}]}})
            await master.op_unregister(None, {"node": "n1"})
        assert results["recover"]["missing"] == ["n1"]
        assert set(results["recover"]["reports"]) == {"n2"}
        assert trio.current_time() < 10

    _run(main)
