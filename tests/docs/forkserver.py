"""A fork server for the documented `kvstore` and `kvstored` commands: the programs
imported once, each command a fork of them.

The docs test runs some two hundred commands, and on a loaded machine a fresh
interpreter spends seconds importing the CLI, the client and the protocol before it
does a millisecond of work. Here one process (``serve``) imports both programs and every
subcommand's module, then forks a child per command; the child takes the caller's
stdin, stdout and stderr (passed over a Unix socket), its arguments, environment and
working directory, and runs the program's ``main`` as the installed script does. What
runs is the real program in a real process; only the imports are shared.

A command is sent by ``run`` (a few lines of the standard library, started with
``python -S``, so it starts in a fraction of the time), which exits with the child's
exit status and passes SIGINT and SIGTERM on to it. Daemons and foreground mounts are
not run here: the docs stop them by the pid that ``$!`` gives, which must be theirs
(tests/docs/blocks.py runs them as the installed scripts).

Usage: ``python forkserver.py serve SOCKET`` (prints ``ready`` once it listens);
``python -S forkserver.py run SOCKET PROGRAM ARG...`` (PROGRAM: kvstore or kvstored).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

#: The programs, as their installed scripts name them (pyproject.toml). ``python``
#: (:func:`python_stdin`) runs the script on its stdin, as ``python -`` does.
PROGRAMS = {"kvstore": "kvstored.cli.tool:main", "kvstored": "kvstored.cli.daemon:main"}
_STATUS = struct.Struct("!i")


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# -- the client ----------------------------------------------------------------------------

def run(path: str, program: str, args: list[str]) -> int:
    request = json.dumps({"program": program, "args": args, "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    socket.send_fds(conn, [_STATUS.pack(len(request)) + request], [0, 1, 2])
    (child,) = _STATUS.unpack(_recv_exactly(conn, _STATUS.size))

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        (status,) = _STATUS.unpack(_recv_exactly(conn, _STATUS.size))
    except EOFError:
        sys.stderr.write("forkserver: the server went away before the command ended\n")
        return 1
    return status


# -- the server ----------------------------------------------------------------------------

def serve(path: str) -> None:
    import importlib
    import selectors

    entries = {}
    for program, target in PROGRAMS.items():
        module, _, attribute = target.partition(":")
        entries[program] = getattr(importlib.import_module(module), attribute)
    entries["python"] = python_stdin
    _preload(entries.values())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through the pipe
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                child = _start(conn, entries, [listener, wake_read, wake_write,
                                               *waiting.values()])
                if child is not None:
                    waiting[child] = conn
            else:
                os.read(wake_read, 4096)
        while waiting:
            child, status = os.waitpid(-1, os.WNOHANG)
            if child == 0:
                break
            conn = waiting.pop(child, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    conn.sendall(_STATUS.pack(128 - code if code < 0 else code))
                except OSError:
                    pass  # the caller went away
                conn.close()


def python_stdin() -> None:
    """``python -``: the script on stdin, as ``__main__``, from the working directory."""
    import builtins

    sys.argv = ["-"]
    sys.path[0] = ""
    source = sys.stdin.read()
    exec(compile(source, "<stdin>", "exec"), {"__name__": "__main__",
                                              "__builtins__": builtins})


def _preload(entries) -> None:
    """Import every subcommand's module too (what `kvstore status` would import)."""
    import importlib

    import click

    from kvstored.cli.lazy import LazyGroup

    def walk(group: click.Group) -> None:
        commands = list(group.commands.values())
        if isinstance(group, LazyGroup):
            for target in group.lazy_commands.values():
                module, _, attribute = target.partition(":")
                try:
                    commands.append(getattr(importlib.import_module(module), attribute))
                except ImportError:
                    pass  # an optional dependency: the command imports it when it runs
        for command in commands:
            if isinstance(command, click.Group):
                walk(command)

    for entry in entries:
        if isinstance(entry, click.Group):
            walk(entry)
    # The trio client of the Python examples, and the client every command that talks
    # to a store uses.
    importlib.import_module("kvstored.aio")
    importlib.import_module("kvstored.client")


def _start(conn: socket.socket, entries, inherited) -> int | None:
    try:
        head, fds, _, _ = socket.recv_fds(conn, _STATUS.size, 3)
        (size,) = _STATUS.unpack(head)
        request = json.loads(_recv_exactly(conn, size))
    except (OSError, EOFError, ValueError, struct.error):
        conn.close()
        return None
    child = os.fork()
    if child:
        for fd in fds:
            os.close(fd)
        conn.sendall(_STATUS.pack(child))
        return child
    # The child: the caller's files, arguments, environment and directory, then the
    # program as its installed script runs it.
    code = 1
    try:
        for item in inherited:
            if isinstance(item, int):
                os.close(item)
            else:
                item.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # As the installed script starts: its path first, its folder on sys.path.
        sys.argv = [os.path.join(os.path.dirname(sys.executable), request["program"]),
                    *request["args"]]
        sys.path[0] = os.path.dirname(sys.executable)  # python_stdin: "", as python -
        try:
            entries[request["program"]]()
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["run"]:
        sys.exit(run(sys.argv[2], sys.argv[3], sys.argv[4:]))
    else:
        sys.exit(__doc__)
