"""The asyncio client against a real store: its calls on the loop's own thread (no
executor, no thread per call), many tasks sharing one client over a bounded number of
connections, both ways of connecting, and a cancelled call that leaves nothing out of
step. (That it gives what the other clients give is tests/client/test_parity.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

import kvstored.asyncio
from kvstored.errors import UnreachableError
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures


class NoThreads(ThreadPoolExecutor):
    """A loop's default executor that fails the test if anything is handed to it."""

    def submit(self, *args, **kwargs):
        raise AssertionError("the asyncio client handed work to a thread")


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_calls_run_on_the_loop_thread_and_tasks_share_one_client(embedded, transport):  # noqa: F811
    up = embedded()
    values = {f"asyncio/{i}": os.urandom(n) for i, n in enumerate([0, 10, 70_000, 1 << 20])}

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(NoThreads(1))
        async with kvstored.asyncio.connect(up.addr, transport=transport) as c:
            keys = list(values)
            assert await c.batch_put(keys, list(values.values())) == [True] * 4
            bufs = [bytearray(len(v)) for v in values.values()]
            assert await c.batch_get_into(keys, bufs) == [len(v) for v in values.values()]
            assert [bytes(b) for b in bufs] == list(values.values())

            async def reader(key: str) -> None:
                assert await c.get(key) == values[key]

            await asyncio.gather(*(reader(k) for _ in range(20) for k in keys))
            peers = c._peers.values()
            assert all(len(p.idle) <= kvstored.asyncio.CONNECTIONS_PER_PEER for p in peers)
            assert await c.batch_exists([keys[0], "asyncio/none"]) == [True, False]

    asyncio.run(main())


def test_an_awaited_connect_and_a_cancelled_call(embedded):  # noqa: F811
    up = embedded()

    async def main() -> None:
        c = await kvstored.asyncio.connect(up.addr, transport="tcp")
        try:
            assert await c.put("asyncio/c", b"value")
            assert await c.get("asyncio/c") == b"value"  # its connections are open
            # The daemon stopped, the request goes out and its reply cannot come: the
            # cancel lands while the call waits for it. (With the daemon running, a
            # loaded machine could let the reply in before the call waited, and the
            # call finished before the cancel.)
            os.kill(up.proc.pid, signal.SIGSTOP)
            try:
                task = asyncio.ensure_future(c.get("asyncio/c"))
                for _ in range(5):  # the call's steps up to its wait for the reply
                    await asyncio.sleep(0)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                os.kill(up.proc.pid, signal.SIGCONT)
            # The cancelled call's connection was closed, not left out of step.
            assert await c.get("asyncio/c") == b"value"
        finally:
            await c.aclose()
        with pytest.raises(UnreachableError, match=r"cannot reach 127\.0\.0\.1:1 "):
            await kvstored.asyncio.connect("127.0.0.1:1", transport="tcp", token="t")

    asyncio.run(main())
