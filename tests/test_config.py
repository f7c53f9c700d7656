"""kvstored.config and `kvstored config`: precedence, provenance, validation, the docs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvstored.cli.config_cmd import reference_markdown
from kvstored.cli.daemon import main
from kvstored.cli.exitcodes import ExitCode
from kvstored.config import (
    SCHEMA,
    SECTION_TYPES,
    SECTIONS,
    SETTINGS,
    debug_requested,
    load_config,
    split_address,
)
from kvstored.errors import ConfigError

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
GiB = 1024**3


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """A developer's own KVSTORED_* variables must not leak into these tests."""
    for name in list(os.environ):
        if name.startswith("KVSTORED_") or name == "KVSTORE_MASTER":
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "kvstored.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- defaults and precedence -----------------------------------------------------------------

def test_defaults_are_typed_and_say_so(tmp_path):
    cfg = load_config(env={"XDG_DATA_HOME": str(tmp_path),
                           "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert cfg.file is None
    assert cfg["master.listen"] == "127.0.0.1:7700"
    assert cfg["master.heartbeat_interval"] == 0.2
    assert cfg["node.dram"] == GiB and cfg["node.ssd"] == 16 * GiB
    assert cfg["node.data"] == tmp_path / "kvstored"
    assert cfg["policy.promote_reads"] == 2 and cfg["policy.dram_only"] is False
    assert cfg["security.auth"] == "token"
    assert cfg["security.token_file"] == tmp_path / "config" / "kvstored" / "token"
    assert cfg["security.node_token_file"] == tmp_path / "config" / "kvstored" / "node-token"
    assert {source for _, _, source in cfg.items()} == {"default"}
    assert [key for key, _, _ in cfg.items()] == [s.key for s in SETTINGS]


def test_data_dir_ignores_a_relative_xdg_data_home(tmp_path):
    cfg = load_config(env={"XDG_DATA_HOME": "relative/dir", "HOME": str(tmp_path)})
    assert cfg["node.data"] == tmp_path / ".local" / "share" / "kvstored"


def test_file_then_env_then_flags_win_and_each_is_recorded(tmp_path):
    path = write(tmp_path, '[node]\ndram = "2GiB"\nssd = "1T"\nbackend = "offset"\n'
                           '[io]\nengine = "uring"\n')
    env = {"KVSTORED_NODE_DRAM": "3GiB", "KVSTORED_IO_ENGINE": "posix",
           "KVSTORED_IO_DIRECT": "1"}
    cfg = load_config(path, env=env, overrides={"node.dram": "4GiB", "node.backend": None},
                      flag_names={"node.dram": "--dram"})
    assert (cfg["node.dram"], cfg.source("node.dram")) == (4 * GiB, "flag --dram")
    assert (cfg["node.ssd"], cfg.source("node.ssd")) == (1024**4, f"file {path}")
    assert (cfg["node.backend"], cfg.source("node.backend")) == ("offset", f"file {path}")
    assert (cfg["io.engine"], cfg.source("io.engine")) == ("posix", "env KVSTORED_IO_ENGINE")
    assert (cfg["io.direct"], cfg.source("io.direct")) == (True, "env KVSTORED_IO_DIRECT")
    assert cfg.source("node.listen") == "default"
    assert cfg.file == path


def test_flag_name_defaults_to_the_key_name():
    cfg = load_config(env={}, overrides={"policy.dram_high_watermark": 0.95,
                                         "node.backend_options": ()})
    assert cfg.source("policy.dram_high_watermark") == "flag --dram-high-watermark"
    assert cfg.source("node.backend_options") == "default"  # an unused repeatable flag


def test_kvstored_config_names_the_default_file_and_an_explicit_path_beats_it(tmp_path):
    from_env = write(tmp_path, '[node]\ndram = "2GiB"\n', "env.toml")
    explicit = write(tmp_path, '[node]\ndram = "3GiB"\n', "explicit.toml")
    env = {"KVSTORED_CONFIG": str(from_env)}
    assert load_config(env=env)["node.dram"] == 2 * GiB
    cfg = load_config(explicit, env=env)
    assert cfg["node.dram"] == 3 * GiB and cfg.file == explicit


def test_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("KVSTORED_NODE_SSD", "2TiB")
    cfg = load_config()
    assert (cfg["node.ssd"], cfg.source("node.ssd")) == (2 * 1024**4, "env KVSTORED_NODE_SSD")


def test_kvstore_master_sets_the_client_master_unless_the_specific_name_is_set():
    cfg = load_config(env={"KVSTORE_MASTER": "10.0.0.5:7700"})
    assert (cfg["client.master"], cfg.source("client.master")) == (
        "10.0.0.5:7700", "env KVSTORE_MASTER")
    cfg = load_config(env={"KVSTORE_MASTER": "10.0.0.5:7700",
                           "KVSTORED_CLIENT_MASTER": "10.0.0.6:7700"})
    assert (cfg["client.master"], cfg.source("client.master")) == (
        "10.0.0.6:7700", "env KVSTORED_CLIENT_MASTER")


# --- unknown names -----------------------------------------------------------------------------

def test_an_unknown_key_in_the_file_names_key_file_line_and_valid_keys(tmp_path):
    path = write(tmp_path, '# comment\n[node]\nssd = "1T"\ndramm = "4GiB"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert f"{path}:4" in message and "node.dramm" in message
    assert "did you mean dram?" in message
    assert "valid keys of [node]: master, listen, data, dram, ssd" in message


def test_an_unknown_section_and_a_key_outside_sections_are_errors(tmp_path):
    path = write(tmp_path, 'dram = "4GiB"\n[polcy]\noffload = "eager"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    problems = caught.value.problems
    assert len(problems) == 2
    assert f"{path}:1" in problems[0] and "outside any section" in problems[0]
    assert "did you mean node.dram?" in problems[0]
    assert f"{path}:2" in problems[1] and "[polcy]" in problems[1]
    assert "did you mean policy?" in problems[1]


def test_an_unknown_variable_in_a_known_section_is_an_error():
    with pytest.raises(ConfigError, match=r"KVSTORED_NODE_DRAMM: no such setting; "
                                          r"did you mean KVSTORED_NODE_DRAM\?"):
        load_config(env={"KVSTORED_NODE_DRAMM": "4GiB"})


def test_kvstored_variables_outside_the_sections_are_ignored():
    env = {"KVSTORED_REQUIRE": "fuse,uring", "KVSTORED_BUILD_WITHOUT_URING": "1",
           "KVSTORED_CONFIG": "", "KVSTORED_LOG": "debug"}
    cfg = load_config(env=env)
    assert cfg.file is None
    assert {source for _, _, source in cfg.items()} == {"default"}


def test_an_unknown_override_key_is_an_error():
    with pytest.raises(ConfigError, match=r"did you mean node\.dram"):
        load_config(env={}, overrides={"node.drm": "1GiB"})


# --- values -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "raw", "expected"), [
    ("node.dram", "512MiB", 512 * 1024**2),
    ("node.dram", "4GiB", 4 * GiB),
    ("node.ssd", "1T", 1024**4),
    ("node.ssd", 4096, 4096),
    ("node.ssd", "0", 0),
    ("master.lease_ttl", "500ms", 0.5),
    ("master.lease_ttl", "5s", 5.0),
    ("master.lease_ttl", "2m", 120.0),
    ("master.lease_ttl", 0.2, 0.2),
    ("master.lease_ttl", 3, 3.0),
    ("master.lease_ttl", "1.5", 1.5),
    ("node.shutdown_flush_timeout", "0", 0.0),  # 0 turns the shutdown flush off
    ("node.shutdown_flush_timeout", "2m", 120.0),
    ("policy.dram_high_watermark", 1, 1.0),
    ("policy.dram_high_watermark", "0.95", 0.95),
    ("policy.promote_reads", "3", 3),
    ("policy.offload", "Watermark", "watermark"),
    ("policy.dram_only", "yes", True),
    ("master.listen", ":7800", "127.0.0.1:7800"),
    ("master.listen", "[::1]:7800", "[::1]:7800"),
    ("master.listen", "node-3.example.com:7800", "node-3.example.com:7800"),
    ("master.metrics", "", ""),
    ("node.backend_options", {"policy": "lru", "slots": 8}, {"policy": "lru", "slots": 8}),
    ("node.backend_options", "policy=lru, capacity=1GiB", {"policy": "lru", "capacity": "1GiB"}),
    ("node.backend_options", ("policy=lru",), {"policy": "lru"}),
])
def test_values_parse_to_their_type(key, raw, expected):
    assert load_config(env={}, overrides={key: raw})[key] == expected


@pytest.mark.parametrize(("key", "raw", "expected_form"), [
    ("node.dram", "4 gigs", "write e.g. 4096, 512MiB, 4GiB, 1T"),
    ("node.dram", True, "is a boolean, not a size"),
    ("node.dram", 0, "below the minimum"),
    ("node.dram", 1.5, "is not a size"),
    ("master.lease_ttl", "5 parsecs", "500ms, 5s, 2m, 1h"),
    ("master.lease_ttl", "0", "positive"),
    ("master.lease_ttl", -1, "positive"),
    ("master.lease_ttl", float("inf"), "finite"),
    ("node.shutdown_flush_timeout", -1, "0 or a positive"),
    ("policy.dram_high_watermark", 1.5, "a number from 0 to 1"),
    ("policy.dram_high_watermark", "most", "a number from 0 to 1"),
    ("policy.promote_reads", 0, ">= 1"),
    ("policy.promote_reads", "two", ">= 1"),
    ("policy.offload", "eagre", "did you mean eager?"),
    ("io.engine", "spdk", "auto, uring, posix"),
    ("io.direct", "maybe", "write true or false"),
    ("node.name", 5, "not a string"),
    ("master.listen", "localhost", "HOST:PORT"),
    ("master.listen", "localhost:99999", "port 0-65535"),
    ("master.listen", "bad_host!:1", "invalid host"),
    ("master.listen", "[nope]:1", "invalid IPv6"),
    ("node.backend_options", "policy", "name=value"),
    ("node.backend_options", {"nested": {"a": 1}}, "flat"),
])
def test_bad_values_name_the_key_the_flag_and_the_form(key, raw, expected_form):
    with pytest.raises(ConfigError) as caught:
        load_config(env={}, overrides={key: raw}, flag_names={key: "--some-flag"})
    message = str(caught.value)
    assert message.startswith(f"flag --some-flag: {key}: ")
    assert expected_form in message


def test_a_bad_value_in_the_file_names_file_and_line_even_when_env_overrides_it(tmp_path):
    path = write(tmp_path, '[master]\nlisten = ":7700"\nlease_ttl = "soon"\n')
    # A typo is reported even though the environment would win: it is still a typo.
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={"KVSTORED_MASTER_LEASE_TTL": "5s"})
    assert str(caught.value).startswith(f"{path}:3: master.lease_ttl: 'soon' is not a duration")


def test_a_bad_value_in_the_environment_names_the_variable():
    with pytest.raises(ConfigError, match=r"^environment KVSTORED_IO_ENGINE: io.engine: 'fast'"):
        load_config(env={"KVSTORED_IO_ENGINE": "fast"})


def test_a_toml_table_where_a_value_belongs_is_located_by_its_header(tmp_path):
    path = write(tmp_path, '[node]\nssd = "1T"\n\n[node.dram]\nsize = 1\n')
    with pytest.raises(ConfigError, match=re.escape(f"{path}:4: node.dram:")):
        load_config(path, env={})


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path, '[node]\nssd = "lots"\nbogus = 1\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={"KVSTORED_IO_DIRECT": "perhaps"})
    assert len(caught.value.problems) == 3
    assert str(caught.value).startswith("3 problems in the configuration:\n  - ")


def test_paths_resolve_against_the_file_folder_or_the_working_directory(tmp_path, monkeypatch):
    path = write(tmp_path, '[node]\ndata = "store"\n[security]\ntoken_file = "secret"\n')
    cfg = load_config(path, env={})
    assert cfg["node.data"] == tmp_path / "store"
    assert cfg["security.token_file"] == tmp_path / "secret"
    monkeypatch.chdir(tmp_path / "..")
    cfg = load_config(path, env={"KVSTORED_NODE_DATA": "elsewhere",
                                 "KVSTORED_SECURITY_TOKEN_FILE": "other"})
    assert cfg["node.data"] == tmp_path.parent / "elsewhere"
    assert cfg["security.token_file"] == tmp_path.parent / "other"


def test_token_files_default_to_the_user_config_dir_and_cannot_be_emptied(tmp_path):
    cfg = load_config(env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": "relative/ignored"})
    assert cfg["security.token_file"] == tmp_path / ".config" / "kvstored" / "token"
    with pytest.raises(ConfigError, match=r"set security\.auth = none"):
        load_config(env={"KVSTORED_SECURITY_TOKEN_FILE": ""})


def test_a_higher_layer_replaces_the_backend_options_table(tmp_path):
    path = write(tmp_path, '[node.backend_options]\npolicy = "lru"\nslots = 8\n')
    cfg = load_config(path, env={"KVSTORED_NODE_BACKEND_OPTIONS": "capacity=1GiB"})
    assert cfg["node.backend_options"] == {"capacity": "1GiB"}
    assert cfg.source("node.backend_options") == "env KVSTORED_NODE_BACKEND_OPTIONS"


# --- files that cannot be used -------------------------------------------------------------------

def test_a_named_file_that_does_not_exist_is_an_error(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"{missing} does not exist"):
        load_config(missing, env={})
    with pytest.raises(ConfigError, match="KVSTORED_CONFIG"):
        load_config(env={"KVSTORED_CONFIG": str(missing)})


def test_invalid_toml_is_an_error_with_its_position(tmp_path):
    path = write(tmp_path, '[node]\ndram = 4GiB\n')
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))} is not valid TOML: .*line 2"):
        load_config(path, env={})


# --- rules across keys ----------------------------------------------------------------------------

@pytest.mark.parametrize("low", ["0.9", "0.95"])
def test_the_low_watermark_must_be_below_the_high_one(low):
    with pytest.raises(ConfigError) as caught:
        load_config(env={"KVSTORED_POLICY_DRAM_LOW_WATERMARK": low})
    message = str(caught.value)
    assert f"policy.dram_low_watermark = {float(low)} (env KVSTORED_POLICY_DRAM_LOW_WATERMARK)" \
        in message
    assert "must be below policy.dram_high_watermark = 0.9 (default)" in message


def test_watermarks_in_order_are_accepted():
    cfg = load_config(env={"KVSTORED_POLICY_DRAM_HIGH_WATERMARK": "0.95",
                           "KVSTORED_POLICY_DRAM_LOW_WATERMARK": "0.9"})
    assert cfg.section("policy")["dram_low_watermark"] == 0.9


def test_heartbeats_must_come_more_often_than_the_node_ttl():
    with pytest.raises(ConfigError, match=r"master.heartbeat_interval = 20 s .* must be below "
                                          r"master.node_ttl = 10 s"):
        load_config(env={}, overrides={"master.heartbeat_interval": "20s"})


# --- the Config object ----------------------------------------------------------------------------

def test_config_sections_dicts_and_copies(tmp_path):
    path = write(tmp_path, '[node.backend_options]\npolicy = "lru"\n')
    cfg = load_config(path, env={"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.section("io") == {"engine": "auto", "direct": True}
    nested = cfg.as_dict()
    assert json.loads(json.dumps(nested)) == nested
    assert nested["node"]["data"] == str(tmp_path / "kvstored")
    assert set(nested) == {"master", "node", "policy", "io", "security", "client"}
    cfg["node.backend_options"]["policy"] = "fifo"
    assert cfg["node.backend_options"] == {"policy": "lru"}
    assert "node.dram" in cfg and len(cfg) == len(SCHEMA)
    with pytest.raises(KeyError, match=r"did you mean node\.dram"):
        cfg["node.drams"]
    with pytest.raises(KeyError, match="sections: master"):
        cfg.section("nodes")
    assert issubclass(ConfigError, ValueError)


def test_split_address():
    assert split_address(":7700") == ("127.0.0.1", 7700)
    assert split_address("[::1]:80") == ("::1", 80)
    assert split_address("example.org:0") == ("example.org", 0)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_address("7700")


# --- `kvstored config` ----------------------------------------------------------------------------

def test_show_prints_values_human_and_raw_with_their_sources(tmp_path):
    path = write(tmp_path, '[node]\nssd = "1T"\n[policy]\noffload = "watermark"\n')
    result = CliRunner().invoke(main, ["config", "show", "--config", str(path)],
                                env={"KVSTORED_NODE_DRAM": "4GiB"})
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]
             if line.strip() and line.split()[0] in SCHEMA}
    assert set(lines) == set(SCHEMA)
    assert result.stdout.splitlines()[0] == f"configuration file: {path}"
    assert "4.0 GiB (4294967296)" in lines["node.dram"]
    assert lines["node.dram"].rstrip().endswith("env KVSTORED_NODE_DRAM")
    assert "1.0 TiB (1099511627776)" in lines["node.ssd"]
    assert lines["node.ssd"].rstrip().endswith(f"file {path}")
    assert "watermark" in lines["policy.offload"]
    assert "200 ms" in lines["master.heartbeat_interval"]
    assert lines["master.heartbeat_interval"].rstrip().endswith("default")


def test_show_json_is_one_document_of_values_and_sources(tmp_path):
    result = CliRunner().invoke(main, ["config", "show", "--json"],
                                env={"KVSTORED_IO_ENGINE": "posix",
                                     "XDG_DATA_HOME": str(tmp_path),
                                     "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert list(document) == list(SCHEMA)
    assert document["io.engine"] == {"value": "posix", "source": "env KVSTORED_IO_ENGINE"}
    assert document["node.dram"] == {"value": GiB, "source": "default"}
    assert document["node.data"]["value"] == str(tmp_path / "kvstored")
    assert document["security.token_file"] == {"value": str(tmp_path / "kvstored" / "token"),
                                               "source": "default"}


def test_show_exits_with_usage_on_a_configuration_error(tmp_path):
    path = write(tmp_path, '[io]\nengin = "posix"\n')
    result = CliRunner().invoke(main, ["config", "show", "--config", str(path)])
    assert result.exit_code == ExitCode.USAGE
    assert f"{path}:2: unknown key io.engin; did you mean engine?" in result.stderr
    assert result.stdout == ""
    result = CliRunner().invoke(main, ["config", "show", "--config", str(tmp_path / "x.toml")])
    assert result.exit_code == ExitCode.USAGE and "does not exist" in result.stderr


def test_keys_lists_every_setting_with_its_environment_variable():
    result = CliRunner().invoke(main, ["config", "keys"])
    assert result.exit_code == 0, result.output
    for setting in SETTINGS:
        assert re.search(rf"^ {re.escape(setting.key)} .* {setting.env} ", result.stdout, re.M)


def test_the_real_console_script_shows_the_configuration(tmp_path):
    script = Path(sys.executable).with_name("kvstored")
    assert script.exists(), f"{script} is missing; run `make setup`"
    path = write(tmp_path, '[node]\nbackend = "file-per-key"\n')
    env = {**os.environ, "KVSTORED_CONFIG": str(path), "KVSTORED_NODE_DRAM": "2GiB"}
    run = subprocess.run([str(script), "config", "show", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["node.backend"] == {"value": "file-per-key", "source": f"file {path}"}
    assert document["node.dram"] == {"value": 2 * GiB, "source": "env KVSTORED_NODE_DRAM"}
    env["KVSTORED_NODE_DRAM"] = "lots"
    run = subprocess.run([str(script), "config", "show"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == ExitCode.USAGE
    assert "environment KVSTORED_NODE_DRAM: node.dram: 'lots' is not a size" in run.stderr


# --- docs/configuration.md ------------------------------------------------------------------------

def test_the_docs_embed_the_generated_reference():
    text = DOC.read_text()
    match = re.search(r"<!-- BEGIN generated[^\n]*-->\n(.*)<!-- END generated -->", text, re.S)
    assert match, "docs/configuration.md lost its generated block markers"
    assert match.group(1) == reference_markdown(), (
        "docs/configuration.md is stale: replace the generated block with the output of "
        "`kvstored config keys --markdown`")
    for setting in SETTINGS:
        assert f"`{setting.key}`" in text and f"`{setting.env}`" in text


def test_the_docs_example_file_loads(tmp_path):
    example = re.search(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    assert example
    cfg = load_config(write(tmp_path, example.group(1)), env={})
    assert cfg["node.dram"] == 64 * GiB and cfg["io.direct"] is True
    assert cfg["node.backend_options"] == {"policy": "lru"}


# --- the typed sections ---------------------------------------------------------------------------

def test_each_section_has_a_typed_view_with_exactly_its_keys():
    cfg = load_config(env={"KVSTORED_CLIENT_TIMEOUT": "7s", "KVSTORED_NODE_DRAM": "2GiB"})
    assert set(SECTION_TYPES) == set(SECTIONS)
    for section, settings in SECTION_TYPES.items():
        fields = [f.name for f in dataclasses.fields(settings)]
        assert fields == [s.name for s in SETTINGS if s.section == section], section
        view = getattr(cfg, section)
        assert isinstance(view, settings)
        assert dataclasses.asdict(view) == cfg.section(section)
    assert cfg.client.timeout == 7.0 and cfg.node.dram == 2 * GiB


def test_kvstored_debug_is_read_one_way_everywhere():
    for value, on in (("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("", False),
                      ("0", False), ("no", False), ("off", False), ("2", False)):
        assert debug_requested({"KVSTORED_DEBUG": value}) is on, value
    assert debug_requested({}) is False


def test_direct_permit_zero_turns_one_trip_reads_off():
    """docs/configuration.md: ``master.direct_permit`` 0 is "off", so it must be accepted
    (a negative one is still refused)."""
    assert load_config(env={"KVSTORED_MASTER_DIRECT_PERMIT": "0"}).master.direct_permit == 0
    with pytest.raises(ConfigError, match=r"master\.direct_permit"):
        load_config(env={"KVSTORED_MASTER_DIRECT_PERMIT": "-1s"})
