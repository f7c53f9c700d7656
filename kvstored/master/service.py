"""The master's RPC service: the cluster's tables behind the master's ops.

:class:`Master` builds the :class:`~kvstored.master.cluster.Cluster` and the three groups
of handlers (:class:`~kvstored.master.node_ops.NodeOps`,
:class:`~kvstored.master.client_ops.ClientOps`,
:class:`~kvstored.master.admin_ops.AdminOps`), and serves their bindings as one
:class:`~kvstored.rpc.Service` (every op of :data:`~kvstored.protocol.MASTER_OPS`, each
once). All state lives in memory and is rebuilt from the nodes' registrations after a
restart. Housekeeping (expired puts and leases, silent nodes, and keeping the garbage
collector's full passes off the table: master/collector.py) runs under a
:class:`~kvstored.supervisor.Supervisor`: a failed pass is logged and counted, and the
next one runs.
"""

from __future__ import annotations

import time

import trio

from kvstored.config import MasterSettings, PolicySettings
from kvstored.master.admin_ops import AdminOps
from kvstored.master.client_ops import ClientOps
from kvstored.master.cluster import Cluster
from kvstored.master.collector import TableCollector
from kvstored.master.node_ops import NodeOps
from kvstored.master.revoke import Revoker
from kvstored.metrics import MasterMetrics
from kvstored.protocol import MASTER_OPS, HelloReply, Role
from kvstored.rpc import ServerLimits, Service
from kvstored.security import Credentials
from kvstored.supervisor import Supervisor


class Master:
    def __init__(self, *, policy: PolicySettings, settings: MasterSettings,
                 credentials: Credentials | None = None,
                 limits: ServerLimits | None = None,
                 metrics: MasterMetrics | None = None) -> None:
        self.metrics = metrics or MasterMetrics()
        self.cluster = Cluster(policy, settings, self.metrics)
        self.supervisor = Supervisor("master", self.metrics.background_errors)
        credentials = credentials or Credentials.open()
        self.node_ops = NodeOps(self.cluster, credentials)
        self.revoker = Revoker(self.cluster, credentials.node)
        self.client_ops = ClientOps(self.cluster, self.revoker)
        self.admin_ops = AdminOps(self.cluster, self.revoker)
        self.service = Service(
            "master", MASTER_OPS,
            [*self.node_ops.bindings(), *self.client_ops.bindings(),
             *self.admin_ops.bindings()],
            credentials=credentials, limits=limits, hello=self._hello)
        self.service.on_disconnect = self.node_ops.disconnected
        self.collector = TableCollector()

    def _hello(self, role: Role) -> HelloReply:
        return HelloReply(service="master", role=role,
                          heartbeat_interval=self.cluster.settings.heartbeat_interval)

    async def run_housekeeping(self) -> None:
        await self.supervisor.forever("housekeeping", self._housekeeping_pass)

    async def _housekeeping_pass(self) -> None:
        await trio.sleep(self.cluster.settings.heartbeat_interval / 2)
        self.cluster.housekeeping(time.monotonic())
        self.collector.tick(len(self.cluster.table.objects))
