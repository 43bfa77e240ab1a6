"""The packfs command: mount, umount, sync, stats, fsck, import."""
from __future__ import annotations

import argparse
import errno
import json
import logging
import logging.handlers
import os
import subprocess
import sys
import time
from typing import NoReturn

from . import __version__, prometheus
from .core import pack
from .fuse import control
from .options import OptionError, Options, describe as describe_options
from .progress import Progress
from .store.disk import Disk


def die(message: str) -> NoReturn:
    print(f"packfs: {message}", file=sys.stderr)
    sys.exit(1)


def mounts() -> dict[str, tuple[str, str]]:
    """Mount point -> (source, fstype), from /proc/mounts."""
    out = {}
    with open("/proc/mounts") as f:
        for line in f:
            src, target, fstype = line.split()[:3]
            out[target.replace("\\040", " ")] = (src.replace("\\040", " "), fstype)
    return out


def _check_mountpoint(mountpoint: str) -> None:
    entry = mounts().get(mountpoint)
    if entry is not None and entry[1] == "fuse.packfs" and _dead(mountpoint, entry[0]):
        # A packfs whose daemon died (kill -9, OOM): clear it so this mount can proceed.
        print(f"packfs: clearing the dead mount at {mountpoint}", file=sys.stderr)
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
    elif entry is not None:
        die(f"{mountpoint} is already a mount point")
    if not os.path.isdir(mountpoint):
        die(f"mount point {mountpoint} does not exist or is not a directory")
    if os.listdir(mountpoint):
        die(f"mount point {mountpoint} is not empty")


def _dead(mountpoint: str, packdir: str, wait: float = 5.0) -> bool:
    """True if the packfs at mountpoint has no daemon any more (its pack lock is free)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.stat(mountpoint)
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                return True
        try:
            fd = pack.lock(packdir)
        except (pack.PackError, OSError):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)  # a daemon that is still exiting holds the lock for a moment
            continue
        os.close(fd)
        return True


def _prepare_packdir(packdir: str) -> None:
    """Initialise an empty or missing PACKDIR; refuse a foreign or incompatible one."""
    if os.path.exists(packdir) and not os.path.isdir(packdir):
        die(f"{packdir} is not a directory")
    existing = packdir if os.path.isdir(packdir) else os.path.dirname(packdir)
    if os.path.isdir(existing) and os.statvfs(existing).f_flag & os.ST_RDONLY:
        die(f"{packdir} is on a read-only filesystem: packfs writes its log, catalog and volumes there")
    try:
        pack.initialise(packdir, Disk())
        pack.read_marker(packdir)
    except (pack.PackError, OSError) as e:
        die(str(e))


def _setup_logging(packdir: str, foreground: bool, debug: bool) -> None:
    """Log to stderr in the foreground, else to PACKDIR/packfs.log. The file is reopened
    when it is moved or deleted (WatchedFileHandler), so logrotate's default rotation
    (rename, then a new file) loses no line to the renamed file."""
    level = logging.DEBUG if debug else logging.INFO
    fmt = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
    if foreground:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.handlers.WatchedFileHandler(os.path.join(packdir, "packfs.log"))
    logging.basicConfig(level=level, format=fmt, handlers=[handler])


def cmd_mount(args: argparse.Namespace) -> int:
    packdir = os.path.abspath(args.packdir)
    mountpoint = os.path.abspath(args.mountpoint)
    try:
        opts = Options.parse(args.o)
    except OptionError as e:
        die(str(e))
    _check_mountpoint(mountpoint)
    _prepare_packdir(packdir)
    from .fuse.daemon import Daemon  # pyfuse3 is needed only by the daemon
    daemon = Daemon(packdir, mountpoint, opts)
    if args.foreground:
        _setup_logging(packdir, True, opts.debug)

        def ready(error: str) -> None:
            if error:
                print(f"packfs: {error}", file=sys.stderr)
        return daemon.run(ready)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end) as f:
            message = f.read()
        if message != "ok":
            os.waitpid(pid, 0)
            die(message or "the daemon died before the mount was ready; see packfs.log")
        return 0
    # The daemon: a session of its own, no terminal, logs to the pack directory.
    os.close(read_end)
    os.setsid()
    try:
        _setup_logging(packdir, False, opts.debug)
    except OSError as e:
        os.write(write_end, str(e).encode())
        os._exit(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)

    def report(error: str) -> None:
        nonlocal write_end
        if write_end >= 0:
            os.write(write_end, (error or "ok").encode())
            os.close(write_end)
            write_end = -1
    try:
        code = daemon.run(report)
    except BaseException:
        logging.getLogger("packfs").exception("daemon failed")
        report("the daemon failed; see packfs.log")
        code = 1
    logging.shutdown()
    os._exit(code)


def _pack_of(mountpoint: str) -> str:
    mountpoint = os.path.abspath(mountpoint)
    entry = mounts().get(mountpoint)
    if entry is None or entry[1] != "fuse.packfs":
        die(f"{mountpoint} is not a mounted packfs")
    return entry[0]


def _ask(packdir: str, command: str) -> dict:
    """The daemon's reply to a control command, or {"error": why there is none}."""
    try:
        return control.request(pack.read_marker(packdir)["pack_id"], command)
    except (OSError, pack.PackError, ValueError) as e:
        return {"error": str(e)}


def cmd_sync(args: argparse.Namespace) -> int:
    """What sync(1) and syncfs(2) cannot do for a FUSE filesystem: the kernel sends no
    SYNCFS to a /dev/fuse daemon, so a file written without an fsync waits for the
    daemon's next commit (commit_interval) however often the machine syncs."""
    reply = _ask(_pack_of(args.mountpoint), "commit")
    if "error" in reply:
        die(f"sync of {args.mountpoint}: {reply['error']}")
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    packdir = _pack_of(args.mountpoint)
    pid_file = os.path.join(packdir, "daemon.pid")
    try:
        pid = int(open(pid_file).read().split()[0])
    except (OSError, ValueError, IndexError):
        pid = 0
    # Durable first: if the checkpoint then fails, or the unmount, the changes are committed.
    reply = _ask(packdir, "commit")
    if "error" in reply:
        print(f"packfs: warning: could not commit before unmounting: {reply['error']}", file=sys.stderr)
    reply = _ask(packdir, "sync")
    if "error" in reply:
        print(f"packfs: warning: could not checkpoint before unmounting: {reply['error']}", file=sys.stderr)
    r = subprocess.run(["fusermount3", "-u", os.path.abspath(args.mountpoint)], capture_output=True, text=True)
    if r.returncode:
        die(f"cannot unmount {args.mountpoint}: {r.stderr.strip()}")
    while pid and _alive(pid):
        time.sleep(0.02)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _passthrough_line(p: dict) -> str:
    if not p.get("active"):
        return "passthrough    off: every write() of a file is a request"
    return (f"passthrough    {p['staged']:>12,}   O_TMPFILE files written by the kernel to a staging file; "
            f"{p['open']:,} open now, {p['absorbed_bytes'] / 2**20:,.1f} MiB taken into the log, "
            f"{p['refused']:,} not staged, {p['shared']:,} opened meanwhile by a reader")


def cmd_stats(args: argparse.Namespace) -> int:
    packdir = _pack_of(args.mountpoint)
    try:
        stats = control.request(pack.read_marker(packdir)["pack_id"], "stats")
    except (OSError, pack.PackError, ValueError) as e:
        die(_unanswered(args.mountpoint, e))
    if "error" in stats:
        die(f"stats of {args.mountpoint}: {stats['error']}")
    if args.prometheus:
        return _emit(prometheus.render(stats).rstrip("\n"))
    return _emit(json.dumps(stats, indent=2) if args.json else format_stats(stats))


def _unanswered(mountpoint: str, e: Exception) -> str:
    """Why the daemon of a listed mount gave no stats, in a line."""
    try:
        os.stat(mountpoint)
    except OSError as dead:
        if dead.errno == errno.ENOTCONN:
            return (f"the daemon of {mountpoint} has died (the mount answers ENOTCONN); "
                    f"`packfs mount` or the packfs@ unit mounts it again")
    return f"stats of {mountpoint}: no answer from its daemon: {getattr(e, 'strerror', None) or e}"


def _emit(text: str) -> int:
    """Print text; if the reader has closed the pipe (`| head`), end quietly with the status
    of a command killed by SIGPIPE (128 + 13), as other Unix tools do."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        return 128 + 13
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def format_stats(s: dict) -> str:
    lines = [
        f"daemon         {s['pid']:>12}   packfs {s['version']}, {s['pack_directory']} at {s['mountpoint']}",
        f"files          {s['files']:>12,}   directories {s['directories']:,}",
        f"bytes          {_size(s['bytes']):>12}   in {s['volumes']} volume(s)",
        f"live / dead    {_size(s['live_bytes']):>12} / {_size(s['dead_bytes'])}   "
        f"(disk holds {_size(s['disk_allocated_bytes'])}, punched {_size(s['punched_bytes'])})",
        f"daemon RSS     {_size(s['rss_bytes']):>12}   ({s['rss_per_file']:.0f} B per file)",
        f"inode columns  {_size(s['column_bytes']):>12}   ({s['inodes']:,} inodes; times far from their mtime: "
        + ", ".join(f"{n} " + ("all (whole times)" if far is None else f"{far:,}") for n, far in s["far_times"].items())
        + ")",
        f"arenas         {_size(s['arena_bytes']['names']):>12}   of names "
        f"({_size(s['arena_free_bytes']['names'])} free); {_size(s['arena_bytes']['xattrs'])} of xattrs "
        f"({_size(s['arena_free_bytes']['xattrs'])} free)",
        f"mount load     {s['load_seconds']:>10.2f} s   inode table from the {s['loaded_from']}; "
        f"recovery replayed {s['recovery']['replayed']:,} commits in {s['recovery']['seconds']:.2f} s",
        f"commits        {s['commits']:>12,}   device flushes {s['device_flushes']:,} "
        f"({s['device_flushes_on_loop']:,} by a lone fsync on the event loop), "
        f"writes {s['device_writes']:,}, checkpoints {s['checkpoints']:,}",
        f"uncommitted    {s['uncommitted_inodes']:>12,}   inodes changed since the last commit"
        + (f" ({s['seconds_since_commit']:.1f} s ago)" if s["seconds_since_commit"] is not None else "")
        + f", {_size(s['dirty_bytes'])} of data buffered; {s['pending_checkpoint_inodes']:,} inode changes "
        "wait for the next checkpoint",
        "log writer     " + ("a C thread (never takes the GIL)" if s.get("log_writer") == "c"
                            else "a Python thread (the C part, packfs/store/_logwriter.c, is not built)"),
        "swift form     " + ("read and written in C" if s.get("swift_form_codec") == "c"
                            else "read and written in Python (the C part, packfs/swiftmeta/_swiftform.c, is not built: "
                            "the first getxattr of a Swift GET takes the daemon 60-130 µs more)"),
        f"event loop     {s['fuse_waits_skipped']:>12,}   requests read without a wait (drain), "
        f"{s['busy_poll_turns']:,} polls for a request (busy polling): a request came in "
        f"{s['busy_poll_caught']:,} windows, {s['busy_poll_expired']:,} closed with none",
        "directories    " + ("open without a request; the kernel caches their listings"
                            if s["zero_message_opendir"] else "opened by a FUSE request each (no fuse shim)"),
        f"listing ends   {s['listing_ends_answered_in_shim']:>12,}   readdirs after a listing's last entry, "
        "answered by the fuse shim (no handler: not in the table below)",
        (f"ioctls         {s['ioctls_answered_in_shim']:>12,}   refused by the fuse shim (ENOTTY): the kernel "
         "sends every one, Python's open() one per file (no handler: not in the table below)"
         if s.get("ioctls_counted") else "ioctls         refused by libfuse, not counted (the fuse shim's handler "
         "table is not in use)"),
        ("files          open without a request (no OPEN or RELEASE; a file create makes has no RELEASE)"
         if s["zero_message_open"] else
         f"files          {s['opens_answered_in_shim']:>12,}   opens and {s['releases_answered_in_shim']:,} releases "
         "answered by the fuse shim (passthrough: the kernel must ask; no handler: not in the table below)"
         if s.get("opens_in_shim") else "files          opened by a FUSE request each"),
        (f"metadata       {s['lookups_answered_in_shim']:>12,}   lookups, "
         f"{s['negative_lookups_answered_in_shim']:,} of absent names, {s['getattrs_answered_in_shim']:,} "
         f"getattrs and {s['listings_answered_in_shim']:,} whole listings answered by the fuse shim from the "
         "inode table (no handler: not in the table below)"
         if s.get("metadata_from_shim") else "metadata       every lookup and getattr reaches packfs's handler"),
        (f"xattrs         {s['xattrs_answered_in_shim']:>12,}   getxattrs answered by the fuse shim from the "
         "xattrs packfs last read (no handler: not in the table below)" if s.get("xattrs_from_shim")
         else "xattrs         every getxattr reaches packfs's handler"),
        "set-ID bits    " + ("taken by packfs on write, truncate and chown (the kernel asks no getxattr per write)"
                            if s.get("killpriv_v2") else "taken as the kernel asks (cached writes cost a getxattr each)"),
        "mappings       " + ("MAP_SHARED on any handle, the creating one's too"
                            if s.get("direct_io_mmap") else "MAP_SHARED on a creating handle fails (ENODEV): reopen the file"),
        (f"O_TMPFILE      {s['tmpfiles']:>12,}   files opened with no name (Swift's objects, linked into place)"
         if s.get("o_tmpfile") else "O_TMPFILE      refused (EOPNOTSUPP): Swift names a temporary file and renames it"),
        "fallocate      " + ("served: holes, zeroed ranges, growth; a reservation checks the disk's room"
                            if s.get("fallocate") else "refused (EOPNOTSUPP)"),
        _passthrough_line(s.get("passthrough", {})),
    ]
    if s.get("broken"):
        lines.append(f"BROKEN         writes refused after an I/O error: {s['broken']}")
    lines.append("")
    lines.append(f"{'operation':<12} {'count':>10} {'errors':>8} {'refused':>8} {'mean us':>9} {'p50 us':>9} "
                 f"{'p99 us':>9}")
    for op, o in [*s["operations"].items(), *s.get("device", {}).items()]:
        lines.append(f"{op:<12} {o['count']:>10,} {o['errors']:>8,} {o['refused']:>8,} {o['mean_us']:>9} "
                     f"{o['p50_us']:>9} {o['p99_us']:>9}")
    refused = sum(o["refused"] for o in s["operations"].values())
    if refused:
        lines.append(f"(refused: {refused:,} requests for what packfs does not do, by design, e.g. POSIX ACLs "
                     "that cp -a tries to copy; answered EOPNOTSUPP, not errors)")
    return "\n".join(lines)


def cmd_fsck(args: argparse.Namespace) -> int:
    from .fsck import fsck
    return fsck(os.path.abspath(args.packdir), repair=args.repair)


IMPORT_EPILOG = """\
SOURCE is copied whole: names (any bytes), modes with set-ID and sticky bits, owners,
atime, mtime and ctime to the nanosecond, xattrs (user., trusted., security.), hard
links (as links), symlinks, device nodes, FIFOs, sockets, empty files and directories,
and sparse files with their holes (SEEK_DATA/SEEK_HOLE). It runs as root. SOURCE must
not change while it runs: stop Swift's servers and mount the device read-only. A file
with an xattr packfs cannot keep (system.*, ACLs) is refused by name.

Progress goes to stderr every second; at the end the pack is reopened as a mount would
open it and compared with what was imported, and a summary is printed. Exit status: 0
imported; 1 refused or failed, with one line saying why; 130 interrupted.

Until it has finished, PACKDIR holds packfs.json.importing instead of packfs.json:
mount and fsck refuse it, and running the same import again clears it and starts over.
"""


def cmd_import(args: argparse.Namespace) -> int:
    from .importer import ImportFailed, run_import
    try:
        done = run_import(args.source, args.packdir, Progress(every=1.0, command="import"))
    except ImportFailed as e:
        print(f"packfs import: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"packfs import: interrupted; {args.packdir} holds an unfinished import, which mount and fsck refuse: "
              "run the same import again to start over", file=sys.stderr)
        return 130
    print(done.summary())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packfs", description="Small files packed into append-only volumes, "
                                     "served as a POSIX tree over FUSE.")
    parser.add_argument("--version", action="version", version=f"packfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mount", help="mount PACKDIR at MOUNTPOINT (initialising an empty PACKDIR)",
                       epilog=describe_options(), formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("packdir")
    m.add_argument("mountpoint")
    m.add_argument("-o", metavar="OPT[,OPT...]", help="mount options, below")
    m.add_argument("-f", "--foreground", action="store_true", help="do not daemonise; log to stderr")
    m.set_defaults(func=cmd_mount)
    u = sub.add_parser("umount", help="flush, checkpoint and unmount")
    u.add_argument("mountpoint")
    u.set_defaults(func=cmd_umount)
    y = sub.add_parser("sync", help="commit everything written to a mount and wait until it is durable "
                       "(sync(1) does not reach a FUSE daemon)")
    y.add_argument("mountpoint")
    y.set_defaults(func=cmd_sync)
    s = sub.add_parser("stats", help="files, bytes, space, RSS and per-operation latency of a mount")
    s.add_argument("mountpoint")
    form = s.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="every figure, as JSON (docs/stats.md)")
    form.add_argument("--prometheus", action="store_true",
                      help="every figure in Prometheus's text format, for node_exporter's textfile collector")
    s.set_defaults(func=cmd_stats)
    f = sub.add_parser("fsck", help="verify every record and the catalog of an unmounted pack")
    f.add_argument("packdir")
    f.add_argument("--repair", action="store_true", help="make the pack consistent; report what was done")
    f.set_defaults(func=cmd_fsck)
    i = sub.add_parser("import", help="build a pack in an empty PACKDIR from the directory tree SOURCE "
                       "(a Swift device taken offline), without FUSE", epilog=IMPORT_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("source", metavar="SOURCE", help="the directory whose tree becomes the pack's")
    i.add_argument("packdir", metavar="PACKDIR", help="an empty or missing directory; it becomes the pack")
    i.set_defaults(func=cmd_import)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
