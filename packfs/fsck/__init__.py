"""packfs fsck: verify every record and the catalog of an unmounted pack; --repair.

The check, read-only:

1. Take the pack's lock (PACKDIR/daemon.pid), so a mounted pack is never checked or
   repaired under its daemon.
2. Scan every volume from offset 0. Records start on 4 KiB boundaries; a zero block is a
   hole (punched, or preallocated and never written) and is skipped by block. Every
   header and payload CRC is verified. Blocks that are neither zero nor a valid header
   are garbage (a torn write, a flipped bit, bytes of another pack).
3. Load the catalog and replay the journal exactly as mount does (recovery.replay), on
   a disk wrapper that keeps the replay's tail cut to itself: nothing is written.
4. Cross-check the namespace mount would serve against the scan: every extent must
   point at an intact DATA record of its own inode and length; intact DATA records no
   extent refers to are orphans (space leaks); META records before the checkpoint
   position should have been punched; directory entries, link counts, parent pointers,
   reachability and shared-record counts must agree, and every inode's xattrs must read
   back (unreadable ones are named and left as they are). Every finding names the files
   it touches by path.

Exit status: 0 clean, 1 problems found (with --repair: problems remain after repair),
2 the check could not run (no such directory, pack in use, not a pack).

--repair recovers the log as mount does (cutting the uncommitted tail), then makes the
pack consistent without losing any intact fsync'd file: files whose records are damaged
move to /lost+found/#<inode> with the damaged ranges as holes and described in the
xattr user.packfs.fsck; unreachable inodes go to /lost+found too; dangling entries,
link counts and shared-record counts are fixed; then one catalog checkpoint is written
(packfs.core.catalog), and only after it orphans, stale journal records and damaged blocks
are punched. Each step is safe to interrupt: until the checkpoint commits, the pack is
as it was (plus the tail cut mount would make anyway); after it, only unreferenced
blocks are punched, and a second run punches whatever the first did not get to.

The parts, in the order a run uses them: scan.py reads the volumes, replay.py replays
the log without writing, crosscheck.py compares the two, check.py puts those together,
repair.py fixes what they found, report.py holds the findings (packfs/progress.py writes
the progress lines).
"""
from __future__ import annotations

import os
from typing import Callable

from ..core import pack as packmod
from ..progress import QUIET, Progress
from ..store.disk import Disk
from .check import check_pack
from .repair import XATTR, repair_pack
from .report import Report

__all__ = ["XATTR", "Progress", "Report", "check", "fsck"]


def fsck(packdir: str, repair: bool = False, *, disk: Disk | None = None,
         out: Callable[[str], None] | None = None, lock: bool = True) -> int:
    """`packfs fsck PACKDIR [--repair]`: print one line per finding and a summary; the exit code.
    Progress goes to stderr."""
    report = check(packdir, repair=repair, disk=disk, out=out or _print, lock=lock, progress=Progress())
    return report.exit_code


def _print(line: str) -> None:
    print(line, flush=True)


def check(packdir: str, repair: bool = False, *, disk: Disk | None = None,
          out: Callable[[str], None] | None = None, lock: bool = True, progress: Progress = QUIET) -> Report:
    """Check (and with repair=True, repair) a pack; returns the report of the final state."""
    out = out or (lambda line: None)
    packdir = os.path.abspath(packdir)
    report = Report(packdir)
    lock_fd = -1
    if not os.path.isdir(packdir):  # said so, not an errno of the lock file's path
        report.error = f"{packdir} " + ("is not a directory" if os.path.exists(packdir) else "does not exist")
        out(report.summary())
        return report
    try:
        if lock:
            try:
                lock_fd = packmod.lock(packdir)
            except packmod.PackError:
                report.error = f"{packdir} is mounted (its daemon holds {packdir}/daemon.pid); unmount it first"
                out(report.summary())
                return report
            except OSError as e:
                report.error = f"cannot lock {packdir}: {e}"
                out(report.summary())
                return report
        disk = disk or Disk()
        try:
            return _run(packdir, repair, disk, report, out, progress)
        except OSError as e:
            report.error = f"I/O error: {e}"
            out(report.summary())
            return report
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def _run(packdir: str, repair: bool, disk: Disk, report: Report, out: Callable[[str], None],
         progress: Progress) -> Report:
    first = check_pack(packdir, disk, report, progress)
    for f in report.findings:
        out(f.message)
    if not repair or report.error or (not report.problems and not first.tail):
        out(report.summary())
        return report
    if any(f.kind == "catalog" for f in report.findings):
        out("repair: not possible: the catalog itself is damaged or foreign")
        out(report.summary())
        return report
    repair_pack(packdir, disk, report, first, out, progress)
    final = Report(packdir)
    progress.step("checking the repaired pack")
    check_pack(packdir, disk, final, progress)
    final.actions = report.actions
    for f in final.problems:
        out(f"after repair: {f.message}")
    out(final.summary())
    return final
