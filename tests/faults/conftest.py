"""The fault tests start real daemons with the fixtures of :mod:`tests.daemon.conftest`."""

from tests.daemon.conftest import embedded, spawn  # noqa: F401  (fixtures, found by name)
