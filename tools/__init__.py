"""Capacity-planning tools: the hit-rate simulator and the trace tools.

- ``kvstore sim``: replay a trace against cache policies and budgets (docs/simulator.md).
- ``kvstore trace stats|convert``: describe a trace, convert between formats.

The replay runs in a small C core (``_simcore``, built through cffi); the rest is numpy.
"""
