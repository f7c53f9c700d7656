"""The one table from errors to exit codes, and the one way a command fails (in-process)."""

from __future__ import annotations

import ast
import errno
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvstored.cli.errors import (
    QuietError,
    describe,
    exit_code_of,
    message_of,
    report,
)
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import Program, debug_option
from kvstored.config import ConfigError
from kvstored.errors import (
    BadRequestError,
    CorruptDataError,
    InternalError,
    ListenError,
    NoSpaceError,
    NotFoundError,
    UnauthorizedError,
    UnreachableError,
)
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


# --- layering: the core knows no exit codes ---------------------------------------------------

#: Folders below the CLI; none of their modules may import kvstored.cli.
CORE = ["kvstored/errors.py", "kvstored/config.py", "kvstored/rpc.py", "kvstored/wire.py",
        "kvstored/server.py", "kvstored/client", "kvstored/master", "kvstored/node",
        "kvstored/fuse", "sdk", "backends", "native"]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_module_below_the_cli_imports_it():
    offenders = []
    for entry in CORE:
        root = REPO / entry
        for module in [root] if root.is_file() else sorted(root.rglob("*.py")):
            if any(name == "kvstored.cli" or name.startswith("kvstored.cli.")
                   for name in _imports(module)):
                offenders.append(str(module.relative_to(REPO)))
    assert not offenders, f"these import the CLI: {offenders}"


def test_importing_the_store_errors_loads_no_cli_module():
    probe = ("import sys, kvstored.errors, kvstored.client; "
             "print([m for m in sys.modules if m.startswith('kvstored.cli.')])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
