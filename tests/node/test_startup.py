"""A starting node says how far it got: the bucket backend reports every bucket its
open-time recovery loads, and the node's start-up steps log "recovering: ... N of M"
while they last longer than a second (and nothing when they are quick)."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from kvstored.backends.bucket import BucketBackend
from kvstored.node import startup
from kvstored.node.startup import StartupProgress, StartupStep
from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.registry import open_backend, parse_options


def test_the_bucket_backend_reports_each_bucket_its_recovery_loads(tmp_path):
    with open_backend("bucket", tmp_path, bucket_keys=10) as backend:
        for batch in range(7):
            backend.batch_write([(f"k{batch}-{i}", b"v" * 100) for i in range(10)])
    seen: list[tuple[int, int, str]] = []
    with open_backend("bucket", tmp_path, progress=lambda *a: seen.append(a)) as backend:
        assert backend.usage().objects == 70
    assert seen == [(n, 7, "buckets") for n in range(8)]


def test_progress_reaches_only_backends_that_take_it(tmp_path):
    seen = []
    with open_backend("file-per-key", tmp_path, progress=seen.append):
        pass
    assert seen == []


def test_a_configuration_cannot_set_the_programs_callbacks():
    for hook in ("progress", "on_evict"):
        try:
            parse_options(BucketBackend, {hook: "print"})
        except InvalidRequestError as exc:
            assert f"unknown option {hook!r}" in str(exc)
        else:
            raise AssertionError(f"{hook} was accepted from a configuration")


def _run_step(seconds: float, caplog) -> list[str]:
    async def main() -> None:
        progress = StartupProgress()
        async with progress.logged(StartupStep.REGISTERING, logging.getLogger("t"),
                                   lambda: "node n1") as step:
            for sent in range(1, 5):  # 1,000 at 0 s, 2,000 at 1.25 s, ...
                step.update(sent * 1000, 4000, "objects")
                await trio.sleep(seconds / 4)

    with caplog.at_level(logging.INFO, logger="t"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return [r.getMessage() for r in caplog.records if r.name == "t"]


def test_a_long_step_logs_how_far_it_got_and_when_it_finished(caplog):
    # 1 s in, then every 2 s (1 s, 3 s), then the end (4.5 s)
    assert (startup.FIRST_AFTER, startup.INTERVAL) == (1.0, 2.0)
    head = "node n1: recovering: registering with the master: "
    assert _run_step(4.5, caplog) == [head + "1,000 of 4,000 objects",
                                      head + "3,000 of 4,000 objects",
                                      head + "4,000 of 4,000 objects: done in 4.5s"]


def test_a_quick_step_logs_nothing(caplog):
    assert _run_step(0.5, caplog) == []


def test_a_step_that_fails_raises_its_own_error_not_a_group():
    # The master session's log line and retry must see the refusal itself ("belongs to a
    # live node"), not the ticker nursery's ExceptionGroup around it.
    async def main() -> None:
        with pytest.raises(ValueError, match="refused"):
            async with StartupProgress().logged(StartupStep.REGISTERING,
                                                logging.getLogger("t"), lambda: "n1"):
                raise ValueError("refused")

    trio.run(main)
