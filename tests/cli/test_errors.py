"""The one table from errors to exit codes, and the one way a command fails (in-process)."""

from __future__ import annotations

import ast
import builtins
import errno
import importlib
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvstored.bench import BenchError, no_space
from kvstored.cli.errors import (
    EXIT_CODES,
    QuietError,
    describe,
    exit_code_of,
    message_of,
    report,
)
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import Program, debug_option
from kvstored.errors import (
    BadRequestError,
    ConfigError,
    CorruptDataError,
    InternalError,
    ListenError,
    NoSpaceError,
    NotFoundError,
    UnauthorizedError,
    UnavailableError,
    UnreachableError,
)
from kvstored.fuse.errors import MountError
from kvstored.native.errors import EngineUnavailableError
from kvstored.sdk.errors import (
    BackendIOError,
    CapacityError,
    CorruptionError,
    InvalidRequestError,
    UnknownBackendError,
    ValueTooLargeError,
)
from kvstored.tools.errors import TraceError, TraceNotFoundError, UsageProblem

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("error", "code"), [
    (NotFoundError("no object 'k'"), ExitCode.NOT_FOUND),
    (UnreachableError("cannot reach"), ExitCode.UNREACHABLE),
    (CorruptDataError("bad"), ExitCode.CORRUPT),
    (NoSpaceError("full"), ExitCode.NO_SPACE),
    (BadRequestError("bad"), ExitCode.USAGE),
    (UnauthorizedError("token"), ExitCode.USAGE),
    (InternalError("oops"), ExitCode.FAILURE),
    (UnknownBackendError("x", ["bucket"]), ExitCode.USAGE),
    (ValueTooLargeError("big"), ExitCode.USAGE),
    (InvalidRequestError("belongs to"), ExitCode.USAGE),
    (CapacityError("full"), ExitCode.NO_SPACE),
    (CorruptionError("stamp"), ExitCode.CORRUPT),
    (BackendIOError("read", errno=errno.EIO), ExitCode.FAILURE),
    (BackendIOError("write", errno=errno.ENOSPC), ExitCode.NO_SPACE),
    (ConfigError("bad key"), ExitCode.USAGE),
    (UnavailableError("FUSE is unavailable"), ExitCode.UNAVAILABLE),
    (EngineUnavailableError("uring", "no liburing"), ExitCode.UNAVAILABLE),
    (MountError("the kernel refused"), ExitCode.FAILURE),
    (BenchError("a write failed"), ExitCode.FAILURE),
    (no_space("/tmp has 1 MiB free"), ExitCode.NO_SPACE),
    (FileNotFoundError(errno.ENOENT, "x does not exist (--trace)"), ExitCode.NOT_FOUND),
    (TraceError("t.jsonl", "not JSON", line=2), ExitCode.CORRUPT),
    (TraceNotFoundError("no trace"), ExitCode.NOT_FOUND),
    (UsageProblem("unknown model"), ExitCode.USAGE),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "x"), ExitCode.NOT_FOUND),
    (OSError(errno.ENOSPC, "/dev/shm has 1 GiB free"), ExitCode.NO_SPACE),
    (ListenError(("127.0.0.1", 7700), OSError(errno.EADDRINUSE, "in use")), ExitCode.IN_USE),
    (ListenError(("10.9.9.9", 1), OSError(errno.EADDRNOTAVAIL, "no")), ExitCode.USAGE),
    (PermissionError(errno.EACCES, "Permission denied"), ExitCode.FAILURE),
    (QuietError("said so", ExitCode.NOT_FOUND), ExitCode.NOT_FOUND),
])
def test_each_error_family_has_its_exit_code(error, code):
    assert exit_code_of(error) == code


def test_a_bug_is_not_in_the_table_and_says_so():
    assert exit_code_of(TypeError("unsupported operand")) is None
    code, message = describe(KeyError("nodes"))
    assert code == ExitCode.FAILURE
    assert message.splitlines()[0] == "unexpected error: KeyError: 'nodes'"
    assert "--debug" in message and "KVSTORED_DEBUG=1" in message


def test_messages_drop_pythons_decorations():
    assert message_of(FileNotFoundError(errno.ENOENT, "No such file or directory", "a/b")) \
        == "a/b: No such file or directory"
    listen = ListenError(("127.0.0.1", 7700), OSError(errno.EADDRINUSE, "Address in use"))
    assert message_of(listen).startswith("cannot serve on 127.0.0.1:7700 (Address in use);")
    io_error = BackendIOError("read", errno=errno.EIO, path="/d")
    assert "[Errno" not in message_of(io_error) and io_error.errno == errno.EIO


def test_a_task_group_reports_its_known_error_not_the_group():
    group = BaseExceptionGroup("nursery", [BaseExceptionGroup("inner", [
        RuntimeError("boom"), UnknownBackendError("nope", ["bucket"])])])
    assert describe(group)[0] == ExitCode.USAGE
    assert "unknown storage backend 'nope'" in describe(group)[1]
    assert describe(BaseExceptionGroup("g", [ValueError("x"), KeyboardInterrupt()])) == \
        (ExitCode.INTERRUPTED, "interrupted")


def test_report_prints_one_line_and_a_traceback_only_with_debug(capsys):
    error = NoSpaceError("no DRAM room", key="k")
    assert report(error, command="kvstore put", debug=False) == ExitCode.NO_SPACE
    assert capsys.readouterr().err == "kvstore put: no DRAM room (key 'k')\n"
    try:
        raise error
    except NoSpaceError as raised:
        assert report(raised, command="kvstore put", debug=True) == ExitCode.NO_SPACE
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("kvstore put: no DRAM room (key 'k')\n")


def _program(failure: BaseException) -> click.Group:
    @click.group("prog", cls=Program)
    @debug_option
    def prog() -> None:
        pass

    @prog.command()
    @debug_option
    def fail() -> None:
        raise failure

    return prog


@pytest.mark.parametrize("args", [["fail"], ["--debug", "fail"], ["fail", "--debug"]])
def test_every_command_fails_through_the_programs_one_handler(args):
    def nested() -> None:
        raise CorruptionError("record 7 fails its checksum", path="/d/b")

    try:
        nested()
    except CorruptionError as exc:
        failure = exc
    result = CliRunner().invoke(_program(failure), args)
    assert result.exit_code == ExitCode.CORRUPT
    assert result.stderr.endswith("prog fail: record 7 fails its checksum (at /d/b)\n")
    assert ("Traceback" in result.stderr) == ("--debug" in args)


def test_kvstored_debug_in_the_environment_shows_the_traceback():
    result = CliRunner(env={"KVSTORED_DEBUG": "1"}).invoke(
        _program(ZeroDivisionError("division by zero")), ["fail"])
    assert result.exit_code == ExitCode.FAILURE
    assert "Traceback" in result.stderr
    assert "prog fail: unexpected error: ZeroDivisionError: division by zero" in result.stderr


def test_usage_errors_keep_clicks_form_and_code():
    result = CliRunner().invoke(_program(RuntimeError()), ["fail", "--nope"])
    assert result.exit_code == ExitCode.USAGE
    assert "No such option '--nope'" in result.stderr and "Usage:" in result.stderr


# --- the table covers every taxonomy ------------------------------------------------------

#: Error classes of the layers below the CLI that never reach it as they are, and why.
NEVER_REACH_THE_CLI = {
    "kvstored.wire.FrameError": "the clients turn it into UnreachableError or "
                                "CorruptDataError; servers close the connection",
    "kvstored.wire.ConnectionClosed": "the clients turn it into UnreachableError",
    "kvstored.shm.SegmentUnavailable": "the client falls back to TCP",
    "kvstored.shm.SegmentExistsError": "kvstored node/up say the data directory is in use "
                                       "(run_cmd), exit 8",
    "kvstored.sdk.testing.kit.NotApplicable": "the kit reports the check not applicable, "
                                              "with the reason",
    "kvstored.sdk.testing.powerloss.PowerFsError": "the kit reports the power check as "
                                                   "failed, with the message",
    "kvstored.sdk.registry.BackendNameClashWarning": "a warning, not an error: the built-in "
                                                     "keeps its name",
    "kvstored.fuse.errors.InvalidName": "the mount answers ENOENT",
    "kvstored.backends.threefs.journal.JournalFormatError": "3fs recovery reports it as a "
                                                            "problem",
}


def _error_classes() -> list[str]:
    """Every exception class defined below the CLI, as ``module.Class``, found by
    parsing (so that no optional dependency has to import)."""
    builtin = {name for name, value in vars(builtins).items()
               if isinstance(value, type) and issubclass(value, BaseException)}
    folders = {"kvstored": "kvstored", "sdk": "kvstored.sdk", "backends": "kvstored.backends",
               "native": "kvstored.native", "tools": "kvstored.tools"}
    found: dict[str, tuple[str, list[str]]] = {}
    for folder, package in folders.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO / folder)
            if folder == "kvstored" and relative.parts[0] in ("cli", *folders):
                continue
            parts = relative.with_suffix("").parts
            module = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    found[node.name] = (module, [ast.unparse(b).rpartition(".")[2]
                                                 for b in node.bases])
    errors: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, (_module, bases) in found.items():
            if name not in errors and any(
                    b in errors or b in builtin
                    for b in bases):
                errors.add(name)
                grew = True
    return sorted(f"{found[name][0]}.{name}" for name in errors)


def test_every_error_class_below_the_cli_has_an_exit_code_or_a_reason_not_to():
    """The CLI's table names each family of every layer's taxonomy, and no class below
    the CLI carries an exit code of its own."""
    classes = _error_classes()
    assert "kvstored.errors.NotFoundError" in classes and len(classes) > 30
    missing, coded = [], []
    for dotted in classes:
        module, _, name = dotted.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if hasattr(cls, "exit_code"):
            coded.append(dotted)
        if dotted in NEVER_REACH_THE_CLI:
            continue
        if not (issubclass(cls, OSError) or any(issubclass(cls, mapped)
                                                for mapped, _code in EXIT_CODES)):
            missing.append(dotted)
    assert not missing, f"add these to kvstored.cli.errors.EXIT_CODES: {missing}"
    assert not coded, f"only the CLI knows exit codes; these carry one: {coded}"


def test_importing_the_store_errors_loads_no_cli_module():
    probe = ("import sys, kvstored.errors, kvstored.client; "
             "print([m for m in sys.modules if m.startswith('kvstored.cli.')])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
