"""kvstored.server: the settings a node's backend is opened with."""

from __future__ import annotations

import pytest

from kvstored.config import load_config
from kvstored.server import node_config


def _node_options(tmp_path, env=None, overrides=None) -> dict:
    cfg = load_config(env={"XDG_DATA_HOME": str(tmp_path),
                           "XDG_CONFIG_HOME": str(tmp_path / "config"), **(env or {})},
                      overrides=overrides)
    return node_config(cfg).backend_options


@pytest.mark.parametrize("backend", ["bucket", "offset"])
def test_a_node_reads_ssd_with_o_direct_unless_told_not_to(tmp_path, backend):
    """DRAM is the node's cache: its backend opens SSD files with O_DIRECT by default,
    and io.direct (file, environment or flag) turns that off."""
    base = {"node.backend": backend}
    assert _node_options(tmp_path, overrides=base)["direct"] is True
    assert _node_options(tmp_path, env={"KVSTORED_IO_DIRECT": "0"},
                         overrides=base)["direct"] is False
    assert _node_options(tmp_path, overrides={**base, "io.direct": "false"})["direct"] is False


def test_a_backend_without_the_option_is_not_handed_it(tmp_path):
    options = _node_options(tmp_path, overrides={"node.backend": "file-per-key"})
    assert "direct" not in options and "engine" not in options
