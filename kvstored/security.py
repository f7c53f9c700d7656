"""Who may talk to kvstored, and the files that prove it (the model is docs/security.md).

- :class:`Credentials`: the tokens a server accepts, and which :class:`Role` each grants.
  The *client token* lets a connection read, write and administer objects; the *node
  token* also lets it register as a node, commit and report. Holding the client token
  gives no way to the node token.
- Token files: the master creates both at first start, 0600 in a 0700 directory (by
  default ``$XDG_CONFIG_HOME/kvstored``, else ``~/.config/kvstored``), and the same user's
  clients and nodes read them from there by themselves; another user cannot read them.
  A node learns the client token from the master when it registers, so a node on
  another host needs only a copy of the node token. A token file that cannot be used
  (missing, unreadable, empty) is a :class:`~kvstored.errors.ConfigError` naming it.
- :func:`make_private_dir`: the directories the daemon creates are 0700.

This module checks nothing on the wire itself: :mod:`kvstored.rpc` asks
:meth:`Credentials.grant` about each hello.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from kvstored.config import load_config
from kvstored.errors import ConfigError, UnauthorizedError, UnreachableError
from kvstored.protocol import Hello, Role

log = logging.getLogger(__name__)

#: Random bytes in a generated token (it is written as URL-safe base64 text).
TOKEN_BYTES = 32


# -- private files and directories ---------------------------------------------------------

def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and any missing parents) as 0700; an existing directory is left
    as it is, with a warning if other users can enter it."""
    path = Path(path)
    missing = []
    for parent in (path, *path.parents):
        if parent.exists():
            break
        missing.append(parent)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made by a concurrent start
        os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask
    if not missing:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("%s is open to other users (mode %04o); `chmod 700 %s` keeps its "
                        "contents private", path, mode, path)
    return path


def create_token_file(path: Path) -> str:
    """Write a new random token to ``path`` (0600, in a 0700 directory) unless the file
    exists; either way return the token in the file. Concurrent starts agree: the file
    appears whole or not at all (written aside, then linked into place)."""
    path = Path(path)
    try:
        token = _create_token_file(path)
    except FileExistsError:
        return read_token_file(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the token file {path}: {exc.strerror or exc}; name a writable "
            "place with security.token_file / security.node_token_file (or the flags), or "
            "set XDG_CONFIG_HOME") from None
    log.info("created the token file %s (mode 0600)", path)
    return token


def _create_token_file(path: Path) -> str:
    make_private_dir(path.parent)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(aside, path)  # FileExistsError: a concurrent start made it first
    finally:
        aside.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return token


def read_token_file(path: Path, what: str = "token file") -> str:
    """The token in ``path``: its first line, without surrounding blanks."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"the {what} {path} does not exist") from None
    except PermissionError:
        raise ConfigError(f"the {what} {path} cannot be read by this user "
                               f"(uid {os.getuid()}): permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} {path} is not text; it must hold one line, "
                               "the token") from None
    except OSError as exc:
        raise ConfigError(f"the {what} {path} cannot be read: "
                               f"{exc.strerror or exc}") from None
    token = text.strip().partition("\n")[0].strip()
    if not token:
        raise ConfigError(f"the {what} {path} is empty; put the token in it, or delete "
                               "it to have the master generate one at its default path")
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = 0
    if mode & 0o077:
        log.warning("the %s %s is readable by other users (mode %04o): anyone who can read "
                    "it may use the store; `chmod 600 %s`", what, path, mode, path)
    return token


# -- what a server accepts --------------------------------------------------------------------

def _same(presented: str, expected: str) -> bool:
    # compare_digest refuses non-ASCII str: compare the UTF-8 bytes.
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


@dataclass
class Credentials:
    """The tokens one server accepts. With ``required`` False every peer gets the role it
    asks for (``security.auth = none``). ``client`` may be unknown for a while: a node
    learns it from its master when it registers."""

    required: bool
    client: str | None = None
    node: str | None = None

    @classmethod
    def open(cls) -> Credentials:
        return cls(required=False)

    def grant(self, hello: Hello) -> Role:
        """The role ``hello`` may have, or the error that refuses it."""
        if not self.required:
            return hello.role
        token = hello.token
        if token is None:
            raise UnauthorizedError(
                f"this server requires a {hello.role.value} token and none was presented; "
                "see docs/security.md (clients read ~/.config/kvstored/token by default)")
        if self.node is not None and _same(token, self.node):
            return hello.role
        if hello.role is Role.NODE:
            raise UnauthorizedError("node operations need the node token "
                                    "(security.node_token_file); this one is not it")
        if self.client is None:
            raise UnreachableError("this node has not registered with its master yet, so it "
                                   "cannot check client tokens; retry in a moment")
        if _same(token, self.client):
            return Role.CLIENT
        raise UnauthorizedError("wrong token: it is not this cluster's client token; pass "
                                "the cluster's --token-file (docs/security.md)")


# -- what a client presents ------------------------------------------------------------------

@dataclass(frozen=True)
class ClientToken:
    """The token a client presents, and where it came from (for error messages)."""

    token: str | None
    origin: str

    def explain(self, error: UnauthorizedError) -> UnauthorizedError:
        """``error`` with a line saying which token this client presented."""
        return UnauthorizedError(f"{error.message} (this client presented {self.origin})",
                                 key=error.key)


def find_client_token(token: str | None = None,
                      token_file: str | os.PathLike[str] | None = None) -> ClientToken:
    """The token a client presents: ``token`` if given, else the first line of
    ``token_file``, else the configuration's ``security.token_file`` (its default is
    where the master generated it) if that file exists. No token at all when
    ``security.auth = none`` or the file is missing or unreadable (the server then says
    whether it needs one). A ``token_file`` that cannot be read, or a configuration that
    cannot be, raises :class:`~kvstored.errors.ConfigError`."""
    if token is not None:
        return ClientToken(token, "the token passed to connect()")
    if token_file is not None:
        return ClientToken(read_token_file(Path(token_file)), f"the token in {token_file}")
    try:
        cfg = load_config()
    except ConfigError as exc:
        raise ConfigError(f"cannot tell which token to present: {exc}") from None
    if cfg["security.auth"] == "none":
        return ClientToken(None, "no token (security.auth = none)")
    path = cfg["security.token_file"]
    try:
        return ClientToken(read_token_file(path), f"the token in {path}")
    except ConfigError as exc:
        return ClientToken(None, f"no token: {exc}")
