"""What the figures promise a reader: no curve hidden under another, the recommended
budget labelled at a tick, legends off the curves, TTFT from 0, the SSD size stated."""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.tools import plots
from kvstored.tools.simulate import SimOptions, simulate

from .conftest import random_requests
from .test_tiered import _trace

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def tiered_result():
    trace = _trace(random_requests(9, requests=160))
    return simulate([], SimOptions(bytes_per_token=(1 << 30) / 10, block_size=1,
                                   budgets_gib=[0.5, 1, 2, 4, 8], ssd_gib=4,
                                   policies=["lru", "s3fifo", "tiered"]), trace=trace)


def _legend_outside(axis, fig) -> bool:
    fig.canvas.draw()
    legend = axis.get_legend().get_window_extent()
    return legend.x0 >= axis.get_window_extent().x1 - 1


def test_sim_figure(tiered_result):
    fig = plots.sim_figure(tiered_result)
    top, bottom = fig.axes[:2]
    lines = {line.get_label().split(" ")[0]: line for line in top.get_lines()}
    # LRU is drawn wider and below S3-FIFO, which is dashed: both stay visible
    assert lines["lru"].get_linewidth() > lines["s3fifo"].get_linewidth()
    assert lines["lru"].get_zorder() < lines["s3fifo"].get_zorder()
    assert lines["s3fifo"].get_linestyle() == "--"
    # the recommended budget is a tick, and its legend entry gives its size and value
    rec = tiered_result["recommended"]
    assert rec["gib"] in list(bottom.get_xticks())
    labels = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert any(t.startswith("recommended") and f"{rec['speedup']:.2f}x" in t for t in labels)
    # the tiered curve says which SSD it sits on
    assert any(t.startswith("tiered") and "4 GiB SSD" in t for t in labels)
    assert all(_legend_outside(axis, fig) for axis in (top, bottom))
    assert top.get_ylim()[0] == 0 and bottom.get_ylim()[0] == 1
    plots.pyplot().close(fig)


def test_tier_figure(tiered_result):
    fig = plots.tier_figure(tiered_result)
    left, right = fig.axes[:2]
    assert right.get_ylim()[0] == 0                       # TTFT from 0
    assert "4 GiB SSD" in fig._suptitle.get_text()        # the SSD size is stated
    fig.canvas.draw()
    for axis in (left, right):                            # legends below the axes
        assert axis.get_legend().get_window_extent().y1 <= axis.get_window_extent().y0
    plots.pyplot().close(fig)


def test_plan_heatmap_marks_the_recommendation():
    result = {"dramGib": [1, 2], "ssdGib": [0, 4], "trace": {"sources": ["t"]},
              "model": {"label": "m"},
              "cells": [{"dramGib": d, "ssdGib": s, "ttftSpeedup": x, "ttftSeconds": 1 / x}
                        for d, s, x in ((1, 0, 1.5), (1, 4, 2.5), (2, 0, 2.0), (2, 4, 3.0))],
              "recommended": {"dramGib": 1, "ssdGib": 4, "ttftSpeedup": 2.5, "cost": 12.0}}
    fig = plots.plan_heatmap(result)
    axis = fig.axes[0]
    box = axis.patches[0]
    assert (box.get_x(), box.get_y()) == (0.5, -0.5)       # column SSD 4, row DRAM 1
    assert "2.50x" in axis.get_title() and "$12" in axis.get_title()
    assert sorted(t.get_text() for t in axis.texts) == ["1.50x", "2.00x", "2.50x", "3.00x"]
    assert np.isclose(fig.axes[0].images[0].get_array().max(), 3.0)
    plots.pyplot().close(fig)
