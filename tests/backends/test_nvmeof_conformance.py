"""nvmeof passes the whole conformance kit on a regular file and on a loop device, on
both io engines.

On a loop device each check gets a fresh one (``losetup --find --show`` over a sparse
file), attached in the store-directory mode a node uses (``device`` option), with
O_DIRECT on as it is by default for block devices. Where the machine has no loop devices
those classes skip, saying why.
"""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from kvstored.sdk.testing import BackendConformance
from tests.backends.test_offset_conformance import NeedsUring, RemoveVolumes

LOOP_IMAGE_SIZE = 256 << 20


def attach_loop(image) -> str:
    """A loop device over ``image`` (a fresh sparse file), or skip with the reason."""
    if os.geteuid() != 0:
        pytest.skip("loop devices need root (losetup)")
    if shutil.which("losetup") is None:
        pytest.skip("losetup is not installed (util-linux)")
    with open(image, "wb") as f:
        f.truncate(LOOP_IMAGE_SIZE)
    done = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"this machine cannot attach a loop device: losetup says "
                    f"{done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def detach_loop(device: str) -> None:
    subprocess.run(["losetup", "--detach", device], capture_output=True, timeout=30)


@contextlib.contextmanager
def loop_attached(image) -> Iterator[str]:
    """:func:`attach_loop`, detached again when the block ends."""
    device = attach_loop(image)
    try:
        yield device
    finally:
        detach_loop(device)


@pytest.fixture
def loop_device(tmp_path):
    with loop_attached(tmp_path / "loop.img") as device:
        yield device


class TestNvmeofFilePosix(RemoveVolumes, BackendConformance):
    backend = "nvmeof"
    options = {"engine": "posix"}


class TestNvmeofFileUring(NeedsUring, BackendConformance):
    backend = "nvmeof"
    options = {"engine": "uring"}


class OnLoopDevice(RemoveVolumes):
    """Each check on a fresh loop device, named by the ``device`` option."""

    engine = "posix"

    @pytest.fixture(autouse=True)
    def _fresh_device(self, loop_device):
        self.options = {"engine": self.engine, "device": loop_device}

    # A block device cannot be cut short: the kit reports the checks that truncate a file
    # (torn_write_truncated, check_reports_dropped_record) as not applicable here; the
    # file classes above run them.


class TestNvmeofLoopPosix(OnLoopDevice, BackendConformance):
    backend = "nvmeof"


class TestNvmeofLoopUring(OnLoopDevice, NeedsUring, BackendConformance):
    backend = "nvmeof"
    engine = "uring"
