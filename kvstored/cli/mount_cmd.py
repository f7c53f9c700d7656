"""``kvstore mount``: the read-only FUSE view of a cluster or of a backend directory."""

from __future__ import annotations

import logging
import os
import sys

import click

from kvstored.cli.background import run_in_background
from kvstored.cli.connection import client_options, offline_options, open_client, reach
from kvstored.cli.errors import QuietError
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import state
from kvstored.errors import UnavailableError
from kvstored.params import ExistingDirectory


@click.command()
@click.argument("mountpoint",
                type=ExistingDirectory(missing_hint="create it first (mkdir -p {path})"))
@offline_options("Show this backend directory (a stopped node's <data>/ssd), without a "
                 "daemon; it is opened read-only and nothing in it is changed.")
@click.option("--foreground/--background", default=True, show_default=True,
              help="Serve in this process until unmounted, or fork and return once mounted.")
@click.option("--direct-io/--page-cache", default=True, show_default=True,
              help="Serve object reads uncached, each read() one request (fastest for big "
                   "reads), or through the page cache (for mmap and many small reads).")
@click.option("-v", "--verbose", is_flag=True, help="Log debugging detail too.")
@client_options
def mount(mountpoint: str, offline_dir: str | None, backend: str | None, foreground: bool,
          direct_io: bool, verbose: bool) -> None:
    """Mount a read-only view of the store on MOUNTPOINT (an empty directory).

    \b
    Live (the cluster at --master):
      MOUNTPOINT/keys/<name>                     every object; reading gives its bytes
      MOUNTPOINT/nodes/<node>/<dram|ssd>/<name>  objects by node and tier
      MOUNTPOINT/stats/cluster.json, stats/nodes/<node>.json
    Offline (--offline DIR, a stopped node's <data>/ssd, opened read-only):
      MOUNTPOINT/keys/<name>, MOUNTPOINT/stats/backend.json
    \b
    Names encode keys reversibly (docs/fuse.md); `getfattr -d` shows an object's key,
    tier, size, checksum, replicas and location. Unmount with `fusermount3 -u MOUNTPOINT`
    (or Ctrl-C in the foreground). Every write gets EROFS.
    """
    from kvstored.capabilities import probe_fuse

    if backend and not offline_dir:
        raise click.UsageError("--backend only applies with --offline DIR")
    available, reason = probe_fuse()
    if not available:
        raise UnavailableError(f"FUSE is unavailable: {reason}")
    if os.path.ismount(mountpoint):
        raise QuietError(f"something is already mounted on {mountpoint}; unmount it first "
                         f"(fusermount3 -u {mountpoint})", ExitCode.IN_USE)
    logging.basicConfig(format="kvstore mount: %(levelname)s: %(message)s",
                        level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr)
    logging.getLogger("kvstored").setLevel(logging.DEBUG if verbose else logging.INFO)

    from kvstored.fuse.mount import mount as run_mount

    if offline_dir:
        from kvstored.backends.offline import identify
        from kvstored.fuse.offline import OfflineSource

        directory = os.path.abspath(offline_dir)
        # Fail before mounting (or forking) when the directory holds no store; errors
        # opening it (a running node holds it...) reach kvstored.cli.errors as they are.
        name = identify(directory, backend)

        def open_source():
            return OfflineSource.open(directory, name)

        fsname = f"kvstored-offline:{directory}"
    else:
        from kvstored.fuse.live import LiveSource

        cluster = reach(state())  # read before a background fork

        def open_source():
            return LiveSource(open_client(cluster))

        fsname = f"kvstored:{cluster.master}"
    target = os.path.abspath(mountpoint)

    def serve(mounted) -> None:
        run_mount(open_source, target, fsname=fsname, mounted=mounted, direct_io=direct_io)

    if foreground:
        serve(_announce)
        return
    click.echo(run_in_background(lambda ready: serve(lambda point, shown: ready(
        f"{shown} mounted read-only on {point} by process {os.getpid()}; unmount with "
        f"`fusermount3 -u {point}`")), debug=state().debug), err=True)


def _announce(mountpoint: str, fsname: str) -> None:
    click.echo(f"kvstore mount: {fsname} mounted read-only on {mountpoint}; unmount with "
               f"`fusermount3 -u {mountpoint}` or Ctrl-C", err=True)
