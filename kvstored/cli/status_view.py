"""How ``kvstore status`` lays out the master's status reply on a terminal.

It fits 80 columns and never shortens an identifier: node names and addresses are what
``--node`` and ``ssh`` need, so each stands whole on its line (a terminal narrower than
the name wraps it; nothing here cuts it). The tiers are a table of numbers; each node is
a short block of labelled lines, as ``kubectl describe`` does, not a row of a wide table
whose columns would have to shrink. ``--json`` prints the reply itself instead.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kvstored.protocol import NodePhase
from kvstored.protocol.master_api import NodeStatus, StatusReply
from kvstored.sdk.units import format_size

#: Width of the labels of a node's lines ("checksum  ").
_LABEL = 10


def _share(used: int, capacity: int) -> str:
    return f"{used / capacity:.1%}" if capacity else "-"


def _state(node: NodeStatus) -> tuple[str, str | None]:
    """The node's state word, coloured, and what it is doing when it is not ready."""
    match node.state:
        case NodePhase.STARTING:
            progress = node.registering
            sent, total = (progress.sent, progress.objects) if progress else (0, 0)
            return ("[yellow]starting[/]", f"registering its objects: {sent:,} of {total:,} "
                                           "sent; it takes puts once ready")
        case NodePhase.LEAVING:
            return "[yellow]leaving[/]", "shutting down: serves reads, takes no new puts"
        case NodePhase.DEAD:
            return "[red]dead[/]", "missed its heartbeats; its replicas were dropped"
    return "[green]ready[/]", None


def _line(console: Console, label: str, value: str, *, whole: bool = False) -> None:
    """``  label     value``. A ``whole`` value is an identifier: printed unbroken on
    one line whatever its length. Any other value wraps under itself."""
    if whole:
        console.print(f"  {label:<{_LABEL}}{value}", soft_wrap=True, highlight=False,
                      markup=False, emoji=False)
        return
    grid = Table.grid()
    grid.add_column(width=2 + _LABEL, no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(f"  {label}", Text.from_markup(value, emoji=False))
    console.print(grid)


def _namespaces(console: Console, status: StatusReply) -> None:
    """Each registered namespace's share (and that of the keys outside all of them), once
    some client registered one. A namespace is a key prefix: an identifier, printed whole
    on its own line, its figures below it."""
    spaces = status.namespaces
    if not any(spaces):
        return
    for name in sorted(spaces, key=lambda n: (n == "", n)):
        ns = spaces[name]
        console.print()
        console.print(f"namespace {name}" if name else "outside every namespace",
                      soft_wrap=True, highlight=False, markup=False, emoji=False)
        tiers = ", ".join(f"{tier.upper()} {format_size(count.bytes)}"
                          for tier, count in ns.tiers.items())
        _line(console, "objects", f"{ns.objects:,} ({tiers})")


def render_status(console: Console, reply: dict[str, Any]) -> None:
    """Print the status reply (its wire map, as ``--json`` prints it): the tiers, each
    node, the hit rates."""
    status = StatusReply.from_wire(reply)
    nodes = status.nodes
    console.print(f"{status.objects:,} objects on {len(nodes)} node"
                  f"{'' if len(nodes) == 1 else 's'}", highlight=False)
    tiers = Table("tier", "objects", "logical", "used", "capacity", "use", box=None,
                  pad_edge=False, header_style="bold")
    for column in tiers.columns[1:]:
        column.justify = "right"
    for tier, t in status.tiers.items():
        tiers.add_row(tier, f"{t.objects:,}", format_size(t.logical_bytes),
                      format_size(t.used_bytes), format_size(t.capacity_bytes),
                      _share(t.used_bytes, t.capacity_bytes))
    console.print(tiers)
    _namespaces(console, status)
    for node in nodes:
        state, detail = _state(node)
        console.print()
        # The name alone after "node ": copied whole, whatever the width.
        console.print(f"node {node.node}", soft_wrap=True, highlight=False,
                      markup=False, emoji=False)
        _line(console, "state", state)
        if detail:
            _line(console, "", escape(detail))
        _line(console, "address", node.address, whole=True)
        _line(console, "backend", node.backend or "-", whole=True)
        dram, ssd = node.dram, node.ssd
        _line(console, "DRAM", f"{format_size(dram.used)} of {format_size(dram.capacity)} "
                               f"used ({_share(dram.used, dram.capacity)})")
        _line(console, "SSD", f"{format_size(ssd.used)} of {format_size(ssd.capacity)} "
                              f"used ({_share(ssd.used, ssd.capacity)}), "
                              f"{ssd.objects or 0:,} objects")
        _line(console, "checksum", f"{node.corrupt_reads:,} failed reads, "
                                   f"{node.quarantined:,} records quarantined")
        if node.queued_offloads:
            _line(console, "offloads", f"{node.queued_offloads:,} waiting for SSD")
        if node.offload_problem:
            _line(console, "problem", f"offloads fail: {escape(node.offload_problem)}")
    hits = status.hit_rate
    console.print()
    console.print(f"hit rate {hits.total:.1%} (DRAM {hits.dram:.1%}, SSD "
                  f"{hits.ssd:.1%}) over {sum(status.lookups.values()):,} lookups",
                  highlight=False)
