"""Tests of the storage node: its DRAM segment and tiers."""
