"""The daemon's configuration: its schema, loading, validation and provenance.

Every setting has a dotted key (``node.dram``); a TOML section maps to the prefix
(``[node]`` ``dram = "4GiB"``). Values come from four layers, each overriding the one
before it::

    defaults  <  TOML file  <  KVSTORED_* environment  <  command-line flags

The file is the ``path`` given to :func:`load_config`, else ``$KVSTORED_CONFIG``, else
none. Every value is parsed by its setting's type wherever it came from, so a typo is an
error in every layer, not only in the one that wins. Errors name the key, where the
value came from and the form expected; all problems of one load are reported together.

Environment rule: ``KVSTORED_<SECTION>_<KEY>`` uppercased sets ``section.key``. A
``KVSTORED_`` variable whose next word is a section name (``KVSTORED_NODE_DRAMM``) but
whose key is unknown is an error, since it can only be a typo. Other ``KVSTORED_``
variables (``KVSTORED_CONFIG``, ``KVSTORED_DEBUG``, ``KVSTORED_REQUIRE``, build
switches) are not settings and are ignored. ``KVSTORE_MASTER``, the ``kvstore`` tool's
variable, sets ``client.master`` unless ``KVSTORED_CLIENT_MASTER`` is also set.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from kvstored.address import split_address
from kvstored.errors import ConfigError
from kvstored.sdk.units import format_size, parse_bool, parse_size

CONFIG_ENV = "KVSTORED_CONFIG"
ENV_PREFIX = "KVSTORED_"
#: The ``kvstore`` tool's historical name for the master address; sets client.master.
TOOL_MASTER_ENV = "KVSTORE_MASTER"
#: Not a setting: tracebacks with every error, in the programs and in the daemon's log.
DEBUG_ENV = "KVSTORED_DEBUG"


def debug_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``KVSTORED_DEBUG`` asks for tracebacks: 1, true, yes or on (any case);
    anything else, unset included, is off. The programs and the daemon read it here."""
    value = (os.environ if env is None else env).get(DEBUG_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")

@dataclass(frozen=True)
class Origin:
    """Where a raw value came from: ``source`` is what :meth:`Config.source` reports,
    ``where`` is how an error message points at it."""

    source: str
    where: str
    #: Relative paths resolve against this: the config file's folder, else the cwd.
    base_dir: Path | None = None


# --- value types -------------------------------------------------------------------------
# Each kind turns a raw value (a TOML value, or a string from the environment or a flag)
# into the typed value, or raises ValueError saying what was wrong and what to write.

def _reject_bool(raw: Any, what: str) -> None:
    # bool is an int in Python; `dram = true` must not become 1 byte.
    if isinstance(raw, bool):
        raise ValueError(f"{raw!r} is a boolean, not {what}")


class Kind:
    label = ""

    def parse(self, raw: Any, origin: Origin) -> Any:
        raise NotImplementedError

    def show(self, value: Any) -> str:
        """How ``config show`` prints a value."""
        return str(value)


class Size(Kind):
    label = "size"

    def __init__(self, minimum: int = 0):
        self.minimum = minimum

    def parse(self, raw: Any, origin: Origin) -> int:
        _reject_bool(raw, "a size")
        if not isinstance(raw, int | str):
            raise ValueError(f"{raw!r} is not a size; write e.g. 4096, 512MiB, 4GiB, 1T")
        value = parse_size(raw)
        if value < self.minimum:
            raise ValueError(f"{raw!r} is below the minimum of {self.minimum} bytes")
        return value

    def show(self, value: int) -> str:
        return f"{format_size(value)} ({value})"


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Duration(Kind):
    label = "duration"

    def __init__(self, allow_zero: bool = False):
        #: 0 is a meaningful value (it turns something off), not a typo.
        self.allow_zero = allow_zero

    def parse(self, raw: Any, origin: Origin) -> float:
        _reject_bool(raw, "a duration")
        hint = "write seconds (e.g. 5 or 0.2) or a unit: 500ms, 5s, 2m, 1h"
        if isinstance(raw, int | float):
            seconds = float(raw)
        elif isinstance(raw, str) and (match := _DURATION.match(raw)):
            seconds = float(match.group(1)) * _SECONDS[match.group(2)]
        else:
            raise ValueError(f"{raw!r} is not a duration; {hint}")
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.allow_zero):
            what = "0 or a positive" if self.allow_zero else "a positive"
            raise ValueError(f"{raw!r} must be {what}, finite duration; {hint}")
        return seconds

    def show(self, value: float) -> str:
        return f"{value * 1000:g} ms" if value < 1 else f"{value:g} s"


class Fraction(Kind):
    label = "fraction"

    def parse(self, raw: Any, origin: Origin) -> float:
        _reject_bool(raw, "a fraction")
        try:
            value = float(raw) if isinstance(raw, int | float | str) else math.nan
        except ValueError:
            value = math.nan
        if not 0.0 <= value <= 1.0:  # NaN fails this too
            raise ValueError(f"{raw!r} is not a fraction; write a number from 0 to 1, e.g. 0.9")
        return value


class Integer(Kind):
    label = "int"

    def __init__(self, minimum: int):
        self.minimum = minimum

    def parse(self, raw: Any, origin: Origin) -> int:
        _reject_bool(raw, "an integer")
        try:
            value = int(raw) if isinstance(raw, int | str) else None
        except ValueError:
            value = None
        if value is None or value < self.minimum:
            raise ValueError(f"{raw!r} is not a whole number >= {self.minimum}")
        return value


class Boolean(Kind):
    label = "bool"

    def parse(self, raw: Any, origin: Origin) -> bool:
        if not isinstance(raw, bool | str):
            raise ValueError(f"{raw!r} is not a boolean; write true or false (or 1/0)")
        return parse_bool(raw)

    def show(self, value: bool) -> str:
        return "true" if value else "false"


class String(Kind):
    label = "str"

    def parse(self, raw: Any, origin: Origin) -> str:
        if not isinstance(raw, str):
            raise ValueError(f"{raw!r} is not a string; quote it in TOML")
        return raw

    def show(self, value: str) -> str:
        return value if value else '""'


class Address(Kind):
    label = "address"

    def __init__(self, allow_empty: bool = False):
        self.allow_empty = allow_empty
        if allow_empty:
            self.label = "address or empty"

    def parse(self, raw: Any, origin: Origin) -> str:
        if not isinstance(raw, str):
            raise ValueError(f"{raw!r} is not an address; write a quoted HOST:PORT")
        if self.allow_empty and raw.strip() == "":
            return ""
        host, port = split_address(raw)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def show(self, value: str) -> str:
        return value if value else "(off)"


class Choice(Kind):
    def __init__(self, *choices: str):
        self.choices = choices
        self.label = "|".join(choices)

    def parse(self, raw: Any, origin: Origin) -> str:
        text = raw.strip().lower() if isinstance(raw, str) else raw
        if text not in self.choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(self.choices)}"
                             + _did_you_mean(str(raw), self.choices))
        return text


class FilePath(Kind):
    """A path, made absolute: relative to the config file's folder when it came from the
    file (so a file can name its neighbours), else to the working directory."""

    def __init__(self, allow_empty: bool = False, empty_hint: str = "write a path"):
        self.allow_empty = allow_empty
        self.empty_hint = empty_hint
        self.label = "path or empty" if allow_empty else "path"

    def parse(self, raw: Any, origin: Origin) -> Path | None:
        if not isinstance(raw, str | os.PathLike):
            raise ValueError(f"{raw!r} is not a path; write a quoted path")
        if str(raw).strip() == "":
            if self.allow_empty:
                return None
            raise ValueError(f"an empty path is not allowed; {self.empty_hint}")
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = (origin.base_dir or Path.cwd()) / path
        return path

    def show(self, value: Path | None) -> str:
        return "(none)" if value is None else str(value)


class Table(Kind):
    """Free-form ``{name: scalar}``, checked later by whoever consumes it (the backend).
    Besides a TOML table it accepts ``"k=v,k2=v2"`` (environment) and a sequence of
    ``"k=v"`` strings (a repeatable flag); those values stay strings."""

    label = "table"

    def parse(self, raw: Any, origin: Origin) -> dict[str, Any]:
        hint = 'write a TOML table, or "name=value,name2=value2"'
        if isinstance(raw, str):
            raw = [item for item in raw.split(",") if item.strip()]
        if isinstance(raw, list | tuple):
            pairs = {}
            for item in raw:
                name, sep, value = str(item).partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"{item!r} is not name=value; {hint}")
                pairs[name.strip()] = value.strip()
            raw = pairs
        if not isinstance(raw, Mapping):
            raise ValueError(f"{raw!r} is not a table; {hint}")
        for name, value in raw.items():
            if not isinstance(value, str | int | float | bool):
                raise ValueError(f"option {name!r} = {value!r} is not a string, number or "
                                 "boolean; backend options are flat")
        return dict(raw)

    def show(self, value: dict[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in value.items()) if value else "{}"


# --- the schema ----------------------------------------------------------------------------

def _default_data_dir(env: Mapping[str, str]) -> str:
    # XDG base directory spec: a relative XDG_DATA_HOME is invalid and must be ignored.
    xdg = env.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else (
        Path(env["HOME"]) if env.get("HOME") else Path.home()) / ".local" / "share"
    return str(base / "kvstored")


def credentials_dir(env: Mapping[str, str]) -> Path:
    """Where the daemon keeps the tokens it generates, and where the same user's clients
    and nodes look for them: ``$XDG_CONFIG_HOME/kvstored``, else ``~/.config/kvstored``."""
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else (
        Path(env["HOME"]) if env.get("HOME") else Path.home()) / ".config"
    return base / "kvstored"


def _default_token_file(env: Mapping[str, str]) -> str:
    return str(credentials_dir(env) / "token")


def _default_node_token_file(env: Mapping[str, str]) -> str:
    return str(credentials_dir(env) / "node-token")


@dataclass(frozen=True)
class Setting:
    key: str
    kind: Kind
    #: As an operator would write it, or a function of the environment.
    default: Any
    help: str
    #: How docs show the default when it is computed.
    default_doc: str | None = None

    @property
    def section(self) -> str:
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        return self.key.partition(".")[2]

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.replace(".", "_").upper()

    def default_value(self, env: Mapping[str, str]) -> Any:
        return self.default(env) if callable(self.default) else self.default


_MASTER = "127.0.0.1:7700"
_NO_AUTH_HINT = "to run without authentication, set security.auth = none"
SETTINGS: tuple[Setting, ...] = (
    Setting("master.listen", Address(), _MASTER, "Address the master serves clients and nodes on."),
    Setting("master.lease_ttl", Duration(), "5s",
            "How long a read lease pins an object's memory against eviction and removal."),
    Setting("master.max_lock_ttl", Duration(), "30s",
            "The longest a lookup-and-lock holds an object against eviction; a client asking "
            "for longer gets this."),
    Setting("master.direct_permit", Duration(allow_zero=True), "2s",
            "How long a node may serve reads without the master after its last answered "
            "heartbeat (clients read keys they know in one trip); a remove that cannot "
            "reach a node waits this long, and a new master's first puts too. 0: off."),
    Setting("master.put_timeout", Duration(), "30s",
            "A put not committed within this time is abandoned: rolled back and reclaimed."),
    Setting("master.node_ttl", Duration(), "10s",
            "A node silent this long is declared dead and its replicas are dropped."),
    Setting("master.heartbeat_interval", Duration(), "200ms",
            "How often nodes heartbeat (tasks travel in the replies); below node_ttl."),
    Setting("master.metrics", Address(allow_empty=True), "",
            "Prometheus endpoint of the master; empty = off."),
    Setting("node.master", Address(), _MASTER, "The master this node registers with."),
    Setting("node.listen", Address(), "127.0.0.1:0",
            "Address of the node's data server; port 0 picks a free port."),
    Setting("node.data", FilePath(), _default_data_dir,
            "Directory of the node's SSD tier (the backend's files).",
            default_doc="$XDG_DATA_HOME/kvstored, else ~/.local/share/kvstored"),
    Setting("node.dram", Size(minimum=1), "1GiB", "Size of the node's DRAM segment."),
    Setting("node.ssd", Size(), "16GiB", "Capacity of the node's SSD tier."),
    Setting("node.backend", String(), "bucket",
            "SSD backend name (checked against the installed backends at start)."),
    Setting("node.backend_options", Table(), {},
            "Options passed to the backend, e.g. [node.backend_options] policy = \"lru\"."),
    Setting("node.name", String(), "",
            "Node name shown in status and metrics; empty = derived from hostname and listen."),
    Setting("node.metrics", Address(allow_empty=True), "",
            "Prometheus endpoint of the node; empty = off."),
    Setting("node.shutdown_flush_timeout", Duration(allow_zero=True), "30s",
            "On SIGTERM/SIGINT, how long the node may spend writing DRAM-only objects to SSD "
            "before it stops; 0 = drop them."),
    Setting("policy.offload", Choice("eager", "watermark"), "eager",
            "eager: every new object goes to SSD in the background; watermark: only above "
            "offload_watermark."),
    Setting("policy.dram_high_watermark", Fraction(), 0.90,
            "DRAM eviction starts above this fraction of the segment."),
    Setting("policy.dram_low_watermark", Fraction(), 0.80,
            "DRAM eviction frees down to this fraction; below dram_high_watermark."),
    Setting("policy.offload_watermark", Fraction(), 0.70,
            "watermark policy: offloading starts above this DRAM fraction."),
    Setting("policy.promote_reads", Integer(minimum=1), 2,
            "An SSD-only object read this many times within promote_window returns to DRAM."),
    Setting("policy.promote_window", Duration(), "60s", "The window promote_reads counts in."),
    Setting("policy.dram_only", Boolean(), False,
            "Never offload: objects live in DRAM only and are lost on eviction."),
    Setting("io.engine", Choice("auto", "uring", "posix"), "auto",
            "SSD io engine; auto uses io_uring where it works, else POSIX."),
    Setting("io.direct", Boolean(), True,
            "Open SSD files with O_DIRECT (bypass the page cache: DRAM is the cache); "
            "buffered where the file system refuses it."),
    Setting("security.auth", Choice("token", "none"), "token",
            "token: every connection proves its role with a token (docs/security.md); none: "
            "no check at all, every peer may act as a client or a node."),
    Setting("security.token_file", FilePath(empty_hint=_NO_AUTH_HINT), _default_token_file,
            "The client token: clients present it, the master hands it to its nodes. The "
            "master creates it at first start if it is missing at the default path.",
            default_doc="$XDG_CONFIG_HOME/kvstored/token, else ~/.config/kvstored/token"),
    Setting("security.node_token_file", FilePath(empty_hint=_NO_AUTH_HINT),
            _default_node_token_file,
            "The node token: nodes present it to the master, and only it allows node "
            "operations (register, commit, heartbeat). Created like token_file.",
            default_doc="$XDG_CONFIG_HOME/kvstored/node-token, else "
                        "~/.config/kvstored/node-token"),
    Setting("security.hello_timeout", Duration(), "10s",
            "A connection that has not authenticated within this time is closed."),
    Setting("security.preauth_header_limit", Size(minimum=256), "4KiB",
            "Largest frame header accepted before a connection has authenticated."),
    Setting("security.max_connections", Integer(minimum=1), 1024,
            "Open connections one server (the master, or a node's data server) accepts; "
            "beyond it new ones are refused."),
    Setting("security.max_unauthenticated_per_peer", Integer(minimum=1), 32,
            "Connections from one peer address that have not authenticated yet."),
    Setting("security.max_read_staging", Size(minimum=1024 * 1024), "512MiB",
            "Bytes of SSD reads a node holds in staging buffers at once, over all its "
            "connections; a get that needs more is refused (clients split below it)."),
    Setting("client.master", Address(), _MASTER,
            "The master clients and `kvstore` talk to (also KVSTORE_MASTER)."),
    Setting("client.transport", Choice("auto", "tcp", "shm"), "auto",
            "Data path: shm maps a same-host node's segment, tcp works anywhere, auto picks."),
    Setting("client.timeout", Duration(), "30s", "Timeout of one client request."),
    Setting("client.connect_timeout", Duration(), "3s",
            "Timeout of connecting to the master or a node and of the hello that follows."),
    Setting("client.wait_timeout", Duration(), "30m",
            "How long `kvstore flush --wait` and `kvstore recover` wait for the nodes."),
)
SCHEMA: dict[str, Setting] = {setting.key: setting for setting in SETTINGS}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(setting.section for setting in SETTINGS))
_BY_ENV: dict[str, Setting] = {setting.env: setting for setting in SETTINGS}


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# --- the typed sections ------------------------------------------------------------------
# What consumers take: one frozen dataclass per section, its fields the section's keys
# (tests/test_config.py holds them to the schema), built from a loaded Config by
# Config.master, .node, ... Consumers take these, never a default of their own.

@dataclass(frozen=True)
class MasterSettings:
    listen: str
    lease_ttl: float
    max_lock_ttl: float
    direct_permit: float
    put_timeout: float
    node_ttl: float
    heartbeat_interval: float
    metrics: str


@dataclass(frozen=True)
class NodeSettings:
    master: str
    listen: str
    data: Path
    dram: int
    ssd: int
    backend: str
    backend_options: dict[str, Any]
    name: str
    metrics: str
    shutdown_flush_timeout: float


@dataclass(frozen=True)
class PolicySettings:
    offload: str
    dram_high_watermark: float
    dram_low_watermark: float
    offload_watermark: float
    promote_reads: int
    promote_window: float
    dram_only: bool


@dataclass(frozen=True)
class IoSettings:
    engine: str
    direct: bool


@dataclass(frozen=True)
class SecuritySettings:
    auth: str
    token_file: Path | None
    node_token_file: Path | None
    hello_timeout: float
    preauth_header_limit: int
    max_connections: int
    max_unauthenticated_per_peer: int
    max_read_staging: int


@dataclass(frozen=True)
class ClientSettings:
    master: str
    transport: str
    timeout: float
    connect_timeout: float
    wait_timeout: float


#: Each section's dataclass.
SECTION_TYPES: dict[str, type] = {
    "master": MasterSettings, "node": NodeSettings, "policy": PolicySettings,
    "io": IoSettings, "security": SecuritySettings, "client": ClientSettings}

S = TypeVar("S")


class _Section(Generic[S]):
    """A typed section of a :class:`Config`, as an attribute named after the section."""

    def __init__(self, settings: type[S]) -> None:
        self.settings = settings
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, cfg: Config, owner: type | None = None) -> S:
        return self.settings(**cfg.section(self.name))


# --- the loaded configuration ----------------------------------------------------------------

class Config:
    """The effective configuration: a typed value and its source for every key."""

    def __init__(self, values: dict[str, Any], sources: dict[str, str], file: Path | None):
        self._values = values
        self._sources = sources
        #: The TOML file that was read, if any.
        self.file = file

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            raise KeyError(f"{key!r} is not a configuration key" + _did_you_mean(key, SCHEMA))
        # Copies, so a caller cannot change the configuration another caller sees.
        return copy.copy(self._values[key])

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def source(self, key: str) -> str:
        """``"default"``, ``"file /path"``, ``"env KVSTORED_NODE_DRAM"`` or ``"flag --dram"``."""
        self[key]  # the same KeyError for an unknown key
        return self._sources[key]

    def section(self, name: str) -> dict[str, Any]:
        """``{"offload": "eager", ...}`` for ``section("policy")``."""
        if name not in SECTIONS:
            raise KeyError(f"{name!r} is not a section; sections: {', '.join(SECTIONS)}")
        return {s.name: self[s.key] for s in SETTINGS if s.section == name}

    #: The typed sections (see SECTION_TYPES): ``cfg.client.timeout``.
    master = _Section(MasterSettings)
    node = _Section(NodeSettings)
    policy = _Section(PolicySettings)
    io = _Section(IoSettings)
    security = _Section(SecuritySettings)
    client = _Section(ClientSettings)

    def items(self) -> Iterator[tuple[str, Any, str]]:
        """``(key, value, source)`` in schema order."""
        for key in self._values:
            yield key, self[key], self._sources[key]

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain values, JSON-able (paths become strings)."""
        nested: dict[str, dict[str, Any]] = {}
        for key, value, _ in self.items():
            section, _, name = key.partition(".")
            nested.setdefault(section, {})[name] = to_plain(value)
        return nested

    def __repr__(self) -> str:
        return f"Config(file={self.file!s}, {len(self)} keys)"


def to_plain(value: Any) -> Any:
    """A typed value as JSON can carry it."""
    return str(value) if isinstance(value, Path) else value


# --- loading -------------------------------------------------------------------------------

def load_config(path: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None,
                flag_names: Mapping[str, str] | None = None) -> Config:
    """Build the effective configuration: defaults < TOML file < environment < overrides.

    ``path``: the TOML file; ``None`` means ``$KVSTORED_CONFIG`` if set, else no file. A
    file that is named but missing is an error. ``env`` defaults to ``os.environ``.
    ``overrides`` maps dotted keys to values from command-line flags (raw text or typed);
    ``None`` (and the empty tuple click gives an unused repeatable option) means "not
    given". ``flag_names`` maps keys to the flag that set them, for :meth:`Config.source`;
    by default ``node.dram`` is reported as ``--dram``.

    Raises :class:`ConfigError` listing every problem found.
    """
    env = os.environ if env is None else env
    problems: list[str] = []
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(setting: Setting, raw: Any, origin: Origin) -> None:
        try:
            values[setting.key] = setting.kind.parse(raw, origin)
        except ValueError as exc:
            problems.append(f"{origin.where}: {setting.key}: {exc}")
        else:
            sources[setting.key] = origin.source

    for setting in SETTINGS:
        put(setting, setting.default_value(env), Origin("default", "the built-in default"))
    if problems:  # a broken schema, not a user error
        raise AssertionError("; ".join(problems))

    if path is None and env.get(CONFIG_ENV):
        path = env[CONFIG_ENV]
    file = None
    if path is not None:
        file = Path(path).expanduser().absolute()
        for setting, raw, origin in _read_file(file, problems):
            put(setting, raw, origin)
    for setting, raw, origin in _read_env(env, problems):
        put(setting, raw, origin)
    for key, raw in (overrides or {}).items():
        if raw is None or raw == ():
            continue
        setting = SCHEMA.get(key)
        if setting is None:
            raise ConfigError(f"override {key!r} is not a configuration key"
                              + _did_you_mean(key, SCHEMA))
        flag = (flag_names or {}).get(key) or "--" + setting.name.replace("_", "-")
        put(setting, raw, Origin(f"flag {flag}", f"flag {flag}"))

    if not problems:
        problems.extend(_check_relations(values, sources))
    if problems:
        raise ConfigError(problems)
    return Config(values, sources, file)


def _read_file(file: Path, problems: list[str]) -> list[tuple[Setting, Any, Origin]]:
    """The settings a TOML file sets; unknown sections and keys go to ``problems``."""
    try:
        text = file.read_text(encoding="utf-8")
        document = tomllib.loads(text)
    except FileNotFoundError:
        problems.append(f"configuration file {file} does not exist; create it, or pass "
                        f"another with --config or ${CONFIG_ENV}")
        return []
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"configuration file {file} cannot be read: {exc}")
        return []
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{file} is not valid TOML: {exc}; fix the syntax")
        return []

    def where(section: str, key: str | None = None) -> str:
        line = _line_of(text, section, key)
        return f"{file}:{line}" if line else str(file)

    found = []
    for section, body in document.items():
        if section not in SECTIONS:
            if isinstance(body, dict):
                problems.append(f"{where(section)}: unknown section [{section}]"
                                f"{_did_you_mean(section, SECTIONS)} "
                                f"(sections: {', '.join(SECTIONS)})")
            else:
                homes = [s.key for s in SETTINGS if s.name == section]
                hint = f"; did you mean {homes[0]}?" if homes else ""
                problems.append(f"{where('', section)}: {section!r} is outside any section; "
                                f"keys go in [{'], ['.join(SECTIONS)}]{hint}")
            continue
        if not isinstance(body, dict):
            problems.append(f"{where('', section)}: {section} must be a table ([{section}])")
            continue
        for name, raw in body.items():
            setting = SCHEMA.get(f"{section}.{name}")
            if setting is None:
                names = [s.name for s in SETTINGS if s.section == section]
                problems.append(f"{where(section, name)}: unknown key {section}.{name}"
                                f"{_did_you_mean(name, names)} (valid keys of [{section}]: "
                                f"{', '.join(names)})")
                continue
            found.append((setting, raw, Origin(f"file {file}", where(section, name), file.parent)))
    return found


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """Best-effort line of ``key`` in ``[section]`` (``section`` "" is the top level), or
    of the ``[section]`` header when ``key`` is None. For error messages only: tomllib
    reports no positions, and a miss just leaves the line out."""
    dotted = f"{section}.{key}" if section else key
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = re.sub(r"[\s\"']", "", header.group(1))
            if (key is None and current == section) or current == dotted:
                return number
            continue
        name, sep, _ = line.partition("=")
        name = re.sub(r"[\s\"']", "", name)
        if key is not None and sep and (
                (current == section and name == key) or (not current and name == dotted)):
            return number
    return None


def _read_env(env: Mapping[str, str], problems: list[str]) -> list[tuple[Setting, Any, Origin]]:
    """The settings the environment sets (see the module docstring for the rule)."""
    found = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        setting = _BY_ENV.get(name)
        if setting is not None:
            found.append((setting, env[name], Origin(f"env {name}", f"environment {name}")))
            continue
        section = name[len(ENV_PREFIX):].partition("_")[0].lower()
        if section in SECTIONS:
            names = [s.env for s in SETTINGS if s.section == section]
            problems.append(f"environment {name}: no such setting{_did_you_mean(name, names)} "
                            f"(valid: {', '.join(names)}); unset or rename it")
    client_master = SCHEMA["client.master"]
    if TOOL_MASTER_ENV in env and client_master.env not in env:
        found.append((client_master, env[TOOL_MASTER_ENV],
                      Origin(f"env {TOOL_MASTER_ENV}", f"environment {TOOL_MASTER_ENV}")))
    return found


def _check_relations(values: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """Rules that involve more than one key."""

    def cite(key: str) -> str:
        return f"{key} = {SCHEMA[key].kind.show(values[key])} ({sources[key]})"

    problems = []
    rules = (
        ("policy.dram_low_watermark", "policy.dram_high_watermark",
         "eviction frees DRAM down to the low watermark once use passes the high one"),
        ("master.heartbeat_interval", "master.node_ttl",
         "a node that heartbeats less often than node_ttl would be declared dead"),
    )
    for lower, upper, why in rules:
        if not values[lower] < values[upper]:
            problems.append(f"{cite(lower)} must be below {cite(upper)}: {why}")
    return problems


def env_name(key: str) -> str:
    """The environment variable that sets ``key``: ``node.dram`` -> KVSTORED_NODE_DRAM."""
    return SCHEMA[key].env


def choices_of(key: str) -> tuple[str, ...]:
    """The values a choice setting takes (``policy.offload`` -> eager, watermark)."""
    kind = SCHEMA[key].kind
    if not isinstance(kind, Choice):
        raise TypeError(f"{key} is a {kind.label}, not a choice")
    return kind.choices


def describe_default(setting: Setting) -> str:
    """The default as docs print it."""
    if setting.default_doc is not None:
        return setting.default_doc
    default = setting.default
    if isinstance(default, bool):
        return "true" if default else "false"
    return '""' if default == "" else "{}" if default == {} else str(default)

