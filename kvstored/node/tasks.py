"""The tasks a node's master hands it in heartbeat replies, and how the node runs them.

- **offload**: handed to the :class:`~kvstored.node.offload.Offloader`, which batches;
- **drop**: free versions of keys (the DRAM offset, or the SSD checksum, names the
  version, so a drop meant for a removed object never takes a newer one); retried, since
  a drop that never happens leaves the master pointing at a removed object's bytes;
- **promote**: copy SSD objects into DRAM;
- **revoke**: serve keys the master removed to no get_held again (at once, before the
  heartbeat that carried it renews the node's permit to serve get_held);
- **recover**: check (and repair) the SSD tier and report what was found; the node also
  runs one by itself to quarantine a record that failed its checksum.

Each runs under the node's supervisor; outcomes go into the next heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from kvstored.node.dram import DramObject, DramTier
from kvstored.node.offload import Offloader
from kvstored.node.report import Integrity, Outcomes
from kvstored.protocol import Tier
from kvstored.protocol.master_api import (
    DropTask,
    OffloadTask,
    ProblemReport,
    PromoteTask,
    RecoverTask,
    RecoveryReport,
    RevokeTask,
    Task,
)
from kvstored.sdk import Problem, RepairAction, StorageBackend
from kvstored.supervisor import Supervisor, describe_keys

log = logging.getLogger(__name__)

#: The id of the recoveries a node runs by itself (the master's start at 1).
QUARANTINE_ID = 0


def quarantined(problem: Problem) -> bool:
    """Whether a check moved ``problem``'s record to quarantine."""
    return problem.action is RepairAction.QUARANTINED


class TaskRunner:
    """Runs the master's tasks (and the node's own quarantine) in ``nursery``."""

    def __init__(self, *, backend: StorageBackend, dram: DramTier, offloader: Offloader,
                 outcomes: Outcomes, integrity: Integrity, supervisor: Supervisor,
                 wake: Callable[[], None], put_timeout: float) -> None:
        self.backend = backend
        self.dram = dram
        self.offloader = offloader
        self.outcomes = outcomes
        self.integrity = integrity
        self.supervisor = supervisor
        self.wake = wake
        self.put_timeout = put_timeout
        self.nursery: trio.Nursery | None = None
        self._quarantine_pending = False

    def _spawn(self) -> trio.Nursery:
        assert self.nursery is not None, "the node is not running"
        return self.nursery

    def start(self, task: Task) -> None:
        spawn = self.supervisor.spawn
        match task:
            case OffloadTask():
                self.offloader.request(task.keys, urgent=task.urgent)
            case DropTask():
                spawn(self._spawn(), "drop", self.drop, task.tier, task.keys, task.versions,
                      subject=describe_keys(task.keys), attempts=5)
            case PromoteTask():
                spawn(self._spawn(), "promote", self.promote, task.keys,
                      subject=describe_keys(task.keys))
            case RevokeTask():
                self.dram.revoke(task.keys)
            case RecoverTask():
                ident = task.id
                spawn(self._spawn(), "recover", self.recover, ident, task.repair,
                      on_error=lambda exc: self._recover_failed(ident, exc))

    # -- drops -----------------------------------------------------------------------------

    async def drop(self, tier: Tier, keys: list[str], versions: list[int], *,
                   report: bool = True) -> None:
        """Drop versions of keys: DRAM offsets, or SSD checksums."""
        wanted = list(zip(keys, versions))
        if tier is Tier.DRAM:
            done = [(k, v) for k, v in wanted if self.dram.free(k, v)]
        else:
            def delete() -> list[tuple[str, int]]:
                doomed = [(k, c) for k, c in wanted
                          if (r := self.backend.stat(k)) is not None and r.checksum == c]
                self.backend.batch_delete([k for k, _ in doomed])
                return doomed
            done = await trio.to_thread.run_sync(delete)
        if report:
            # Versions already gone count as dropped too: the master only needs to stop
            # pointing at them.
            gone = set(done)
            self.outcomes.dropped([(k, tier, v) for k, v in done]
                                  + [(k, tier, v) for k, v in wanted if (k, v) not in gone])

    # -- promotions ------------------------------------------------------------------------

    async def promote(self, keys: list[str]) -> None:
        placed: list[DramObject] = []
        no_room: list[str] = []
        for key in keys:
            record = self.backend.stat(key)
            if record is None:
                continue  # left the SSD meanwhile: the master hears of that by itself
            if self.dram.allocate(key, record.size, record.checksum,
                                  self.put_timeout) is None:
                no_room.append(key)
                continue
            obj = self.dram.being_written(key)
            assert obj is not None  # allocated just now
            placed.append(obj)
        if no_room:
            self.outcomes.promote_failed(no_room)
        if not placed:
            if no_room:
                self.wake()
            return
        promoted = []
        try:
            results = await trio.to_thread.run_sync(
                self.backend.batch_read, [o.key for o in placed],
                [self.dram.view(o) for o in placed])
            for obj, got in zip(placed, results):
                if got == obj.size:
                    self.dram.commit(obj)
                    promoted.append((obj.key, obj.offset, obj.checksum))
        finally:
            for obj in placed:  # whatever did not make it (or the read raised)
                if not obj.committed:
                    self.dram.free(obj.key, obj.offset)
        self.outcomes.promoted(promoted)
        self.wake()

    # -- recovery --------------------------------------------------------------------------

    async def recover(self, ident: int, repair: bool) -> None:
        report = await trio.to_thread.run_sync(lambda: self.backend.check(repair=repair))
        problems = report.problems
        self.integrity.quarantined_records(sum(1 for p in problems if quarantined(p)))
        lost = [p.key for p in problems
                if p.action and p.key and not self.backend.contains(p.key)]
        self.outcomes.dropped([(k, Tier.SSD, None) for k in lost])
        self.outcomes.recovered(RecoveryReport(
            id=ident, repaired=report.repaired, records_checked=report.records_checked,
            problems=[ProblemReport(kind=p.kind.value, detail=p.detail, key=p.key,
                                    path=p.path,
                                    action=p.action.value if p.action else None,
                                    action_detail=p.action_detail) for p in problems]))
        self.wake()

    def _recover_failed(self, ident: int, exc: Exception) -> None:
        """A recovery that raised still answers the master, so `kvstore recover` reports
        the error instead of waiting for its timeout."""
        self.outcomes.recovered(RecoveryReport(
            id=ident, repaired=False, records_checked=0, problems=[ProblemReport(
                kind="check-failed", path=str(self.backend.path),
                detail=f"the check could not run: {type(exc).__name__}: {exc}; see the "
                       "node's log, then run it again")]))
        self.wake()

    def schedule_quarantine(self) -> None:
        """Run one repairing check soon (a record failed its checksum); one at a time."""
        if self._quarantine_pending:
            return
        self._quarantine_pending = True

        async def run() -> None:
            try:
                await self.recover(QUARANTINE_ID, True)
            finally:
                self._quarantine_pending = False

        self.supervisor.spawn(self._spawn(), "quarantine", run)
