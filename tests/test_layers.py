"""The layers point one way (docs/architecture.md, "Layers").

Every module of the import tree (``kvstored/`` and the folders linked into it) is parsed
with :mod:`ast`; every import in it, at the top or inside a function, is checked:

- against the layer table: a module imports its own layer and the ones its layer may
  import, never a higher one, and the three services (master, node, client) never
  import one another;
- for cycles: an import inside a function that would close an import cycle were it at
  the top is a cycle hidden from the interpreter, and it fails whatever its reason;
- for laziness: an import inside a function is allowed only where :data:`LAZY` says why
  (an optional or heavy dependency, the CLI's commands); anything else goes at the top.

There are no known violations left to tolerate: every check must find none.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The folders of the import tree: each is imported as the package beside it.
PACKAGES = {"kvstored": "kvstored", "sdk": "kvstored.sdk", "backends": "kvstored.backends",
            "native": "kvstored.native", "tools": "kvstored.tools"}

#: Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Pure helpers that import nothing of kvstored: the offset allocator, the version,
    # the click parameter types every command line shares, the progress bar, stopping a
    # child process, the data path's CRC-32C. (Sizes and their units are the SDK's,
    # kvstored.sdk.units.)
    ("base", ("kvstored.allocator", "kvstored.__version__",
              "kvstored.params", "kvstored.address", "kvstored.progress",
              "kvstored.processes", "kvstored.checksum", "kvstored._copy")),
    # The backend SDK: a distribution of its own for backend authors, so it imports
    # nothing else of kvstored (see ALLOWED).
    ("sdk", ("kvstored.sdk",)),
    ("native", ("kvstored.native",)),
    ("backends", ("kvstored.backends",)),
    # What master, node and client share: the errors, the configuration, the protocol
    # and its framing, credentials, metrics, supervision, capability probes.
    ("core", ("kvstored.errors", "kvstored.config", "kvstored.protocol", "kvstored.wire",
              "kvstored.rpc", "kvstored.security", "kvstored.metrics",
              "kvstored.supervisor", "kvstored.capabilities", "kvstored.hostid")),
    # Three services side by side (SERVICES): none imports another.
    ("services", ("kvstored.master", "kvstored.node", "kvstored.client", "kvstored.aio",
                  "kvstored.asyncio", "kvstored")),
    # What is built on the services: running the roles, the FUSE view, the benchmarks,
    # the trace replayer, the engines' adapters, the demo.
    ("apps", ("kvstored.server", "kvstored.fuse", "kvstored.bench", "kvstored.replay",
              "kvstored.integrations", "kvstored.demo")),
    ("cli", ("kvstored.cli",)),
    # The simulator and trace tools stand beside the store: they use the core's helpers
    # only, and the CLI and the benchmarks use them.
    ("tools", ("kvstored.tools",)),
)
LAYER_NAMES = [name for name, _ in LAYERS]

#: What each layer may import besides itself. The stack is a line (each layer the ones
#: below it) except where this says otherwise.
ALLOWED: dict[str, set[str]] = {
    name: set(LAYER_NAMES[:index]) for index, name in enumerate(LAYER_NAMES)}
ALLOWED["sdk"] = set()                        # standalone, for backend authors
ALLOWED["tools"] = {"base", "sdk", "core"}    # beside the store (the SDK: for its units)
for _layer in ("base", "sdk", "native", "backends", "core", "services"):
    ALLOWED[_layer].discard("tools")
ALLOWED["apps"].add("tools")
ALLOWED["cli"].add("tools")

#: The services: each of these prefixes imports none of the others.
SERVICES = (("kvstored.master",), ("kvstored.node",),
            ("kvstored.client", "kvstored.aio", "kvstored.asyncio"))

#: Imports inside a function that are allowed, and why: ``(importer prefix, imported
#: prefix)``. An importer prefix "" means any module.
LAZY: dict[tuple[str, str], str] = {
    # Optional dependencies: absent where their extra or engine is not installed.
    ("", "matplotlib"): "the plot extra: only plots and reports need it",
    ("", "pyfuse3"): "the fuse extra: only the FUSE view and its probe need it",
    ("", "pyverbs"): "RDMA: probed, absent on most machines",
    ("", "kvcache_sim"): "the reference simulator, a dev extra: only `kvstore bench sim`",
    ("", "mooncake"): "Mooncake Store, the benchmark's peer: installed by hand",
    ("", "hypothesis"): "the conformance kit's random sizes: a test dependency",
    ("kvstored.sdk.testing", "pytest"): "the kit runs from the shell too; only its pytest "
                                        "mix-in needs pytest",
    **dict.fromkeys((("kvstored.sdk.testing.powerfs", "trio"),
                     ("kvstored.sdk.testing.powerloss", "trio")),
                    "the power-loss file system runs on pyfuse3's loop, the fuse extra"),
    ("", "rich"): "tables and progress bars, loaded only on a terminal, so that --json "
                  "runs and --help stay fast",
    ("kvstored.native.selection", "kvstored.native.uring"):
        "the io_uring engine runs on the compiled kvstored.native._io, there only where "
        "it was built; the posix engine runs without it",
    ("kvstored.tools.binfile", "crc32c"): "a JSON trace's simulation never loads it: the "
                                          "simulator's memory is held to the reference's",
    # The CLI: `kvstore --help` imports every command's module for its line of help, and
    # a command's module imports what it runs only when it runs.
    ("kvstored.cli.", "kvstored."): "a command's code loads when the command runs",
    ("kvstored.cli.", "trio"): "a command's code loads when the command runs",
    ("kvstored.tools.cli_", "kvstored.tools."): "`kvstore sim --json` loads no report code "
                                                "(rich, plots, HTML): its peak memory is "
                                                "held to the reference simulator's",
    # `import kvstored` stays cheap: the client loads when kvstored.connect is first used.
    ("kvstored", "kvstored.client"): "import kvstored stays cheap",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    #: Inside a function (a lazy import), not at the module's top level.
    lazy: bool
    #: Under ``if TYPE_CHECKING:``: for the type checker only, never run.
    typing_only: bool

    def __str__(self) -> str:
        where = "inside a function" if self.lazy else "at the top"
        return f"{self.importer}:{self.line} imports {self.imported} ({where})"


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for directory, subdirs, files in os.walk(ROOT / folder):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"
                          and not os.path.islink(os.path.join(directory, d))]
            for file in files:
                if not file.endswith(".py"):
                    continue
                path = Path(directory) / file
                parts = path.relative_to(ROOT / folder).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join((package, *parts))] = path
    return found


MODULES = _modules()

#: The extension modules compiled from C at install (setup.py: the cffi build scripts'
#: MODULE and the one Extension). No Python source stands for them, so without this list
#: an import of one would count as an import of the package above it; they import nothing
#: of kvstored.
COMPILED = frozenset({"kvstored.native._io", "kvstored.native._batch",
                      "kvstored.sdk._record_check", "kvstored.tools._simcore",
                      "kvstored._copy"})


def _target(name: str) -> str:
    """The module ``name`` is in: itself, or the longest module prefix of it (for
    ``from package import attribute``)."""
    probe = name
    while probe and probe not in MODULES and probe not in COMPILED:
        probe = probe.rpartition(".")[0]
    return probe or name


def _imports(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, lazy: bool, typing_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            in_function = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                             | ast.Lambda)
            typing = typing_only or (isinstance(child, ast.If)
                                     and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, _target(alias.name) if alias.name.startswith(
                        "kvstored") else alias.name, child.lineno, lazy, typing_only)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - child.level + 1]
                    source = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    source = child.module or ""
                for alias in child.names:
                    if source == "kvstored" and alias.name == "__version__":
                        name = "kvstored.__version__"
                    elif source.startswith("kvstored"):
                        name = _target(f"{source}.{alias.name}")
                    else:
                        name = source
                    yield Import(module, name, child.lineno, lazy, typing_only)
            yield from walk(child, in_function, typing)

    yield from walk(tree, False, False)


IMPORTS = [imp for module, path in sorted(MODULES.items()) for imp in _imports(module, path)]


def layer_of(module: str) -> str | None:
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    return best


def _service(module: str) -> int | None:
    for index, prefixes in enumerate(SERVICES):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def layer_violations(imports: list[Import] = IMPORTS) -> dict[tuple[str, str], list[Import]]:
    """``(importer, imported) -> the imports`` that point up or across the services."""
    found: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports:
        if not imp.imported.startswith("kvstored") or imp.typing_only:
            continue
        low, high = layer_of(imp.imported), layer_of(imp.importer)
        assert low is not None and high is not None, f"{imp}: a module in no layer"
        service_a, service_b = _service(imp.importer), _service(imp.imported)
        across = None not in (service_a, service_b) and service_a != service_b
        if (low != high and low not in ALLOWED[high]) or across:
            found[(imp.importer, imp.imported)].append(imp)
    return found


def _graph(imports: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if imp.imported.startswith("kvstored") and imp.imported != imp.importer \
                and not imp.typing_only:
            graph[imp.importer].add(imp.imported)
    return graph


def _path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A shortest import chain from ``start`` to ``goal``, or None."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        for nxt in sorted(graph.get(node, ())):
            if nxt not in previous:
                previous[nxt] = node
                if nxt == goal:
                    chain = [nxt]
                    while (back := previous[chain[-1]]) is not None:
                        chain.append(back)
                    return chain[::-1]
                queue.append(nxt)
    return None


def hidden_cycles(imports: list[Import] = IMPORTS) -> dict[tuple[str, str], list[str]]:
    """``(importer, imported) -> the chain back`` for each import inside a function that
    would close a cycle at the top of its module (a chain of any imports leads back)."""
    graph = _graph(imports)
    found = {}
    for imp in imports:
        if imp.lazy and not imp.typing_only and imp.imported.startswith("kvstored") \
                and imp.imported != imp.importer:
            chain = _path(graph, imp.imported, imp.importer)
            if chain is not None:
                found[(imp.importer, imp.imported)] = chain
    return found


def _matches(name: str, pattern: str) -> bool:
    """``pattern`` names ``name``, a package above it, or (ending in ``.`` or ``_``) a
    prefix of it; "" matches everything."""
    return (pattern == "" or name == pattern or name.startswith(pattern + ".")
            or (pattern.endswith((".", "_")) and name.startswith(pattern)))


def _lazy_reason(imp: Import) -> str | None:
    for (importer, imported), reason in LAZY.items():
        if _matches(imp.importer, importer) and _matches(imp.imported, imported):
            return reason
    return None


def unexplained_lazy_imports(imports: list[Import] = IMPORTS
                             ) -> dict[tuple[str, str], list[Import]]:
    """Imports inside functions that :data:`LAZY` does not explain."""
    found: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports:
        if imp.lazy and not imp.typing_only and imp.imported != imp.importer \
                and _lazy_reason(imp) is None:
            found[(imp.importer, imp.imported)].append(imp)
    return found


CHECKS = {"layer": layer_violations, "cycle": hidden_cycles,
          "lazy": unexplained_lazy_imports}


def _describe(check: str, key: tuple[str, str], detail) -> str:
    if check == "cycle":
        return f"{key[0]} imports {key[1]} inside a function to hide the cycle " \
               f"{key[0]} -> {' -> '.join(detail)}"
    return "; ".join(sorted({str(imp) for imp in detail}))


def _imp(importer: str, imported: str, *, lazy: bool = False) -> Import:
    return Import(importer, imported, 1, lazy, False)


def test_the_checks_find_what_they_look_for():
    """On a made-up tree: an import up a layer, one across the services, one into the
    CLI from the simulator, a lazy import that hides a cycle, an unexplained lazy one."""
    up = _imp("kvstored.errors", "kvstored.cli.exitcodes")
    across = _imp("kvstored.node.offload", "kvstored.master.table")
    tools = _imp("kvstored.tools.errors", "kvstored.cli.exitcodes")
    fine = [_imp("kvstored.cli.tool", "kvstored.errors"), _imp("kvstored.node.x", "kvstored.sdk"),
            _imp("kvstored.bench.sim", "kvstored.tools.core"),
            _imp("kvstored.backends.x", "kvstored.native")]
    assert set(layer_violations([up, across, tools, *fine])) == {
        ("kvstored.errors", "kvstored.cli.exitcodes"),
        ("kvstored.node.offload", "kvstored.master.table"),
        ("kvstored.tools.errors", "kvstored.cli.exitcodes")}
    assert set(layer_violations([_imp("kvstored.sdk.kit", "kvstored.backends")])) == {
        ("kvstored.sdk.kit", "kvstored.backends")}
    assert set(layer_violations([_imp("kvstored.node.x", "kvstored.tools.core")])) == {
        ("kvstored.node.x", "kvstored.tools.core")}
    cycle = [_imp("kvstored.a", "kvstored.b"), _imp("kvstored.b", "kvstored.c"),
             _imp("kvstored.c", "kvstored.a", lazy=True)]
    assert hidden_cycles(cycle) == {("kvstored.c", "kvstored.a"):
                                    ["kvstored.a", "kvstored.b", "kvstored.c"]}
    assert not hidden_cycles(cycle[1:])
    lazy = [_imp("kvstored.node.x", "kvstored.errors", lazy=True),
            _imp("kvstored.tools.plots", "matplotlib.pyplot", lazy=True),
            _imp("kvstored.cli.mount_cmd", "kvstored.fuse.mount", lazy=True)]
    assert set(unexplained_lazy_imports(lazy)) == {("kvstored.node.x", "kvstored.errors")}


def test_the_compiled_modules_are_the_ones_built():
    """COMPILED names what setup.py builds: each cffi build script's MODULE and each
    Extension, so that a new or renamed one is not taken for its package."""
    built = set()
    for script in ("native/build_io.py", "tools/build_simcore.py"):
        for node in ast.walk(ast.parse((ROOT / script).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MODULE":
                built.add(ast.literal_eval(node.value))
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "Extension":
            built.add(ast.literal_eval(node.args[0]))
    assert built == COMPILED


def test_the_tree_is_found():
    assert {"kvstored.cli.program", "kvstored.sdk.errors", "kvstored.backends",
            "kvstored.native", "kvstored.tools.core", "kvstored.errors"} <= set(MODULES)
    assert len(IMPORTS) > 500
    assert all(layer_of(module) for module in MODULES), [m for m in MODULES if not layer_of(m)]


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_no_new_violations(check):
    found = CHECKS[check]()
    assert not found, f"{len(found)} {check} violations:\n" + "\n".join(
        _describe(check, key, detail) for key, detail in sorted(found.items()))
