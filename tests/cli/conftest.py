"""The CLI tests that need real daemons use the same fixtures as tests/daemon."""

from tests.daemon.conftest import embedded, spawn  # noqa: F401  (fixtures)
