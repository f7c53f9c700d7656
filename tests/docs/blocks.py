"""The code blocks of README.md and docs/*.md, and how each becomes a script to run.

A fenced block's language says what it is:

- ``sh``: commands, run as written (``# exits N`` after a command says it must exit N);
- ``console``: ``$ command`` lines (and their ``\\`` continuations) are run, the other
  lines are the output the reader should see; in the pages of :data:`OUTPUT_CHECKED`
  every output line must appear in what the commands printed (numbers, sizes and times
  may differ: see :func:`normalized`); ``...`` stands for lines left out;
- ``python``: run with the store's Python (README.md and docs/client.md);
- ``text``, ``toml``, ``json``, ``yaml`` and the rest: shown, never run.

A command that starts a daemon role in the foreground (``kvstored up``, ``master``,
``node``) or a FUSE mount in the foreground runs in the background (``$!`` is its pid),
and the next line waits until it serves (a node: until it has registered its objects),
as an operator's next terminal would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh", "console", "python"}
PYTHON_PAGES = {"README.md", "docs/client.md"}
OUTPUT_CHECKED = {"docs/operations.md", "docs/client.md"}

_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)
_EXITS = re.compile(r"#\s*exits?\s+(\d+)\b")
_DAEMON = re.compile(r"^(\w+=\S+\s+)*kvstored\s+(?:--\S+\s+)*(up|master|node)\b")
_MOUNT = re.compile(r"^kvstore\s+(?:--\S+\s+\S+\s+)*mount\b")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    body: str
    #: ``console`` blocks: the output lines the page shows.
    output: list[str] = field(default_factory=list)

    @property
    def ident(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first(self) -> str:
        """The first command, as the skip list names a block."""
        for line in self.commands():
            return line
        return ""

    def commands(self) -> list[str]:
        """The block's commands, one per item, continuation lines joined."""
        if self.lang == "python":
            return [self.body]
        lines = self.body.splitlines()
        if self.lang == "console":
            taken, keep = [], False
            for line in lines:
                if line.startswith("$ "):
                    taken.append(line[2:])
                    keep = line.endswith("\\")
                elif keep:
                    taken.append(line)
                    keep = line.endswith("\\")
            lines = taken
        joined: list[str] = []
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1].rstrip() + " " + line.strip()
            else:
                joined.append(line)
        return [c for c in joined if c.strip() and not c.lstrip().startswith("#")]


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        for match in _FENCE.finditer(text):
            indent, lang = len(match.group(1)), match.group(2)
            body = "".join(line[indent:] if line[:indent].isspace() else line
                           for line in match.group(3).splitlines(keepends=True))
            line = text.count("\n", 0, match.start()) + 1
            block = Block(name, line, lang, body)
            if lang == "console":
                block.output = _output_lines(body)
            found.append(block)
    return found


def _output_lines(body: str) -> list[str]:
    out, continued = [], False
    for line in body.splitlines():
        if line.startswith("$ "):
            continued = line.endswith("\\")
            continue
        if continued:
            continued = line.endswith("\\")
            continue
        out.append(line)
    return out


def script(block: Block) -> str:
    """The bash lines that run ``block`` (the helpers are :data:`PREAMBLE`)."""
    if block.lang == "python":
        return f"__python <<'KVSTORED_DOCS_PY'\n{block.body}KVSTORED_DOCS_PY\n"
    lines = []
    for command in block.commands():
        code = _EXITS.search(command)
        bare = command.split(" #", 1)[0].rstrip() if " #" in command else command
        if bare.endswith("&"):
            bare = bare[:-1].rstrip()
            background = True
        else:
            background = False
        if _DAEMON.match(bare):
            lines.append(f"__daemon {bare}")
        elif _MOUNT.match(bare) and "--background" not in bare:
            lines.append(f"__mount {bare}")
        elif code:
            lines.append(f"__rc=0; {bare} || __rc=$?; __want {code.group(1)} $__rc")
        else:
            lines.append(bare + (" &" if background else ""))
    return "\n".join(lines) + "\n"


#: Defined before every block: `kvstore` and `kvstored` through the fork server when
#: one runs; start a daemon and wait until it serves; mount in the foreground and wait
#: for the mount; check an expected exit code.
PREAMBLE = r"""
if [ -n "${KVSTORED_DOCS_FORKSERVER:-}" ]; then
    # Commands run as forks of one process that has the programs imported
    # (tests/docs/forkserver.py); daemons and mounts below run as the installed scripts.
    kvstore() { "$KVSTORED_DOCS_PYTHON" -I -S "$KVSTORED_DOCS_FORKSERVER" run \
                "$KVSTORED_DOCS_SOCKET" kvstore "$@"; }
    kvstored() { "$KVSTORED_DOCS_PYTHON" -I -S "$KVSTORED_DOCS_FORKSERVER" run \
                 "$KVSTORED_DOCS_SOCKET" kvstored "$@"; }
    __python() { "$KVSTORED_DOCS_PYTHON" -I -S "$KVSTORED_DOCS_FORKSERVER" run \
                 "$KVSTORED_DOCS_SOCKET" python; }
else
    __python() { python -; }
fi
__daemon() {
    local log; log=$(mktemp "$KVSTORED_DOCS_LOGS/daemon.XXXX")
    command "$@" >"$log" 2>&1 &
    echo $! >>"$KVSTORED_DOCS_LOGS/pids"
    local deadline=$((SECONDS + 60))
    # A node serves from its banner on, and takes puts once it has registered its
    # objects: wait for that too, as an operator waits for `kvstore status` to say ready.
    local ready='^kvstored (up|master): listening on|registered [0-9]+ objects with the master'
    until grep -qE "$ready" "$log"; do
        if ! kill -0 $! 2>/dev/null || [ $SECONDS -gt $deadline ]; then
            echo "did not start: $*"; cat "$log"; return 1
        fi
        sleep 0.05  # the poll's interval; the deadline above bounds it
    done
}
__mount() {
    local point; for point in "$@"; do case $point in /*) break;; esac; done
    command "$@" >"$KVSTORED_DOCS_LOGS/mount.log" 2>&1 &
    echo $! >>"$KVSTORED_DOCS_LOGS/pids"
    local deadline=$((SECONDS + 30))
    until mountpoint -q "$point"; do
        if ! kill -0 $! 2>/dev/null || [ $SECONDS -gt $deadline ]; then
            echo "did not mount: $*"; cat "$KVSTORED_DOCS_LOGS/mount.log"; return 1
        fi
        sleep 0.05  # the poll's interval; the deadline above bounds it
    done
}
__want() {
    if [ "$1" != "$2" ]; then echo "expected exit $1, got $2"; exit 1; fi
}
"""

_NUMBER = re.compile(r"\d[\d,]*(\.\d+)?")


def normalized(line: str) -> str:
    """A line as output checks compare it: numbers become ``#`` (sizes, counts, times
    and ports vary from run to run), runs of blanks one space."""
    return " ".join(_NUMBER.sub("#", line).split())


def missing_output(block: Block, printed: str) -> list[str]:
    """The lines ``block`` shows that the run did not print (in order)."""
    seen = [normalized(line) for line in printed.splitlines()]
    missing = []
    position = 0
    for want in block.output:
        if not want.strip() or want.strip() in ("...", "…"):
            continue
        target = normalized(want)
        for index in range(position, len(seen)):
            if target in seen[index]:
                position = index + 1
                break
        else:
            missing.append(want)
    return missing
