"""Credentials and their files, in one process (the real-process model is
tests/faults/test_security.py)."""

from __future__ import annotations

import logging
import os
import stat
import threading

import pytest

from kvstored.errors import ConfigError, UnauthorizedError, UnreachableError
from kvstored.protocol import Hello, Role
from kvstored.security import (
    Credentials,
    create_token_file,
    find_client_token,
    make_private_dir,
    read_token_file,
)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_dirs_are_0700_parents_included(tmp_path, caplog):
    made = make_private_dir(tmp_path / "a" / "b" / "c")
    for path in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert _mode(path) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        make_private_dir(open_dir)
    assert _mode(open_dir) == 0o755 and "chmod 700" in caplog.text


def test_concurrent_first_starts_agree_on_one_token(tmp_path):
    path = tmp_path / "cfg" / "kvstored" / "token"
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(create_token_file(path)))
               for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(set(tokens)) == 1 and read_token_file(path) == tokens[0]
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"]  # no leftovers
    assert len(tokens[0]) >= 40


def test_token_files_that_cannot_be_used_say_why(tmp_path, caplog):
    with pytest.raises(ConfigError, match="does not exist"):
        read_token_file(tmp_path / "nope")
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        read_token_file(tmp_path / "empty")
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not text"):
        read_token_file(tmp_path / "binary")
    loose = tmp_path / "loose"
    loose.write_text("  s3cret  \nsecond line\n")
    loose.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert read_token_file(loose) == "s3cret"
    assert "readable by other users" in caplog.text


def test_grants_follow_the_tokens():
    creds = Credentials(required=True, client="client-t", node="node-t")
    assert creds.grant(Hello(Role.CLIENT, "client-t")) is Role.CLIENT
    assert creds.grant(Hello(Role.NODE, "node-t")) is Role.NODE
    assert creds.grant(Hello(Role.CLIENT, "node-t")) is Role.CLIENT
    for hello, words in ((Hello(Role.NODE, "client-t"), "need the node token"),
                         (Hello(Role.CLIENT, None), "none was presented"),
                         (Hello(Role.CLIENT, "é"), "wrong token"),
                         (Hello(Role.CLIENT, "client-"), "wrong token")):
        with pytest.raises(UnauthorizedError, match=words):
            creds.grant(hello)
    waiting = Credentials(required=True, node="node-t")  # a node before it registered
    with pytest.raises(UnreachableError, match="not registered"):
        waiting.grant(Hello(Role.CLIENT, "anything"))
    assert Credentials.open().grant(Hello(Role.NODE, None)) is Role.NODE


def test_a_client_finds_its_token_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("KVSTORED_SECURITY_TOKEN_FILE", raising=False)
    monkeypatch.delenv("KVSTORED_CONFIG", raising=False)
    found = find_client_token()
    assert found.token is None and str(tmp_path / "kvstored" / "token") in found.origin
    create_token_file(tmp_path / "kvstored" / "token")
    assert find_client_token().token == read_token_file(tmp_path / "kvstored" / "token")
    other = tmp_path / "other"
    other.write_text("from-env\n")
    monkeypatch.setenv("KVSTORED_SECURITY_TOKEN_FILE", str(other))
    assert find_client_token().token == "from-env"
    explicit = tmp_path / "explicit"
    explicit.write_text("from-file\n")
    assert find_client_token(token_file=str(explicit)).token == "from-file"
    assert find_client_token("given", str(explicit)).token == "given"
    monkeypatch.setenv("KVSTORED_SECURITY_AUTH", "none")
    assert find_client_token().token is None


def test_a_token_file_that_cannot_be_created_is_a_clear_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores modes: use a path under a file instead
        locked = tmp_path / "a-file"
        locked.write_text("")
    with pytest.raises(ConfigError, match="cannot create the token file"):
        create_token_file(locked / "kvstored" / "token")
