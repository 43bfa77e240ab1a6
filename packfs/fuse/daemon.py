"""The mounted daemon: open the pack, mount, serve FUSE requests until unmounted."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import time
from typing import Callable

from . import fuseshim  # noqa: I001 -- first: its library must be loaded before pyfuse3 (see fuseshim.py)
import pyfuse3
import trio

from .. import __version__
from ..core import pack
from ..core.filesystem import Filesystem
from ..options import Options
from ..store.disk import Disk
from . import control, fuseloop
from .ops import Operations
from .staging import Staging

log = logging.getLogger("packfs")

Ready = Callable[[str], None]  # '' once mounted and serving, else the reason it failed


def fuse_options(packdir: str, opts: Options) -> set[str]:
    """The options libfuse mounts with. packfs keeps atime itself (the kernel leaves a FUSE
    inode's atime to it); noatime goes to the kernel too, only for /proc/mounts to show,
    which libfuse 3.14 cannot do for strictatime (the kernel's default, relatime, shows)."""
    out = {"fsname=" + packdir, "subtype=packfs", "default_permissions"}
    out |= {"noatime"} if opts.atime == "noatime" else set()
    out |= {"dev"} if opts.dev else set()  # libfuse mounts nodev and nosuid unless told
    out |= {"suid"} if opts.suid else set()
    out |= set() if opts.exec else {"noexec"}
    if opts.allow_other:
        out.add("allow_other")
    if opts.debug:
        out.add("debug")
    return out


def _trim_heap() -> None:
    """Hand the heap's free memory back to the kernel: what the load used and freed (16-49
    MiB of RSS at a million objects, measured), and what a checkpoint's change sets or a
    burst of writes held (glibc keeps it otherwise, in holes the heap top's trim never
    reaches). A no-op without glibc."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def _steady_heap(disk_chunk_size: int) -> None:
    """Keep the buffers of large writes (FUSE requests, records of disk_chunk_size) in the
    heap, and a few of them free for the next ones. glibc's dynamic thresholds let them be
    fresh mappings, or the heap top trimmed after each burst, and every page of a 1 MiB
    stream then came back as a page fault on the event loop: 290,000 minor faults and 1.4 s
    of kernel time for 768 MiB, against 6,500-16,000 and 0.35 s with these settings. At
    most the trim threshold (twice the mmap threshold, 8 MiB by default) of freed heap stays
    with the daemon. A no-op without glibc."""
    mmap_threshold = min(_MMAP_THRESHOLD_MAX, max(4 << 20, 2 * disk_chunk_size))
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    mallopt(_M_TRIM_THRESHOLD, 2 * mmap_threshold)


def _fuse_fd() -> int | None:
    """The /dev/fuse descriptor pyfuse3 opened (it does not say which): ours is the only one."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
        except OSError:
            continue
    return None


class Daemon:
    def __init__(self, packdir: str, mountpoint: str, opts: Options) -> None:
        self.packdir = packdir
        self.mountpoint = mountpoint
        self.opts = opts
        self.unmounted = False  # the kernel unmounted us (fusermount3 -u, umount)
        self.terminated = False  # a signal asked us to stop
        self.closed = False  # the final checkpoint is written: the catalog holds everything
        self.started = 0.0  # time.monotonic() when run() began: the log says how long a mount took
        self.drain: fuseloop.Drain | None = None  # how pyfuse3 waits for requests (fuseloop.py)

    def run(self, ready: Ready) -> int:
        self.started = time.monotonic()
        disk = Disk()
        try:
            lock_fd = pack.lock(self.packdir)
        except (pack.PackError, OSError) as e:
            ready(str(e))
            return 1
        # Loading builds millions of long-lived objects and no garbage cycles: the cyclic
        # collector would only walk them again and again (a third of the load time).
        # Freezing them afterwards keeps later collections from walking the whole table.
        gc.disable()
        try:
            p = pack.open_pack(self.packdir, disk, self.opts.volume_size, self.opts.cache_size,
                               self.opts.xattrs_in_memory)
        except Exception as e:
            log.exception("cannot open %s", self.packdir)
            ready(f"cannot open {self.packdir}: {e}")
            os.close(lock_fd)
            return 1
        finally:
            gc.freeze()
            gc.enable()
            _trim_heap()
            _steady_heap(self.opts.disk_chunk_size)
        log.info("loaded %d inodes from the %s in %.2f s", len(p.ns), p.loaded_from, p.load_seconds)
        if p.recovery.changed:
            log.info("recovery replayed %d commits, dropped %d orphan inodes in %.2f s",
                     p.recovery.replayed, p.recovery.orphans, p.recovery.seconds)
        fs = Filesystem(p, self.opts, disk)
        ops = Operations(fs)
        self.drain = fuseloop.install(self.opts.drain, busy_polling=self.opts.busy_poll_us > 0)
        fs.journal.on_memory_freed = lambda: trio.to_thread.run_sync(_trim_heap)
        fuseshim.enable(self.opts.dircache, self.opts.filecache, self.opts.xattrcache,
                        tmpfile=self.opts.tmpfile, fallocate=self.opts.fallocate, passthrough=self.opts.passthrough,
                        metacache=self.opts.metacache)
        try:
            pyfuse3.init(ops, self.mountpoint, fuse_options(self.packdir, self.opts))
        except Exception as e:
            ready(f"cannot mount {self.mountpoint}: {e}")
            p.volumes.close()
            p.catalog.close()
            os.close(lock_fd)
            return 1
        try:
            # Whatever ends the daemon from here on (a signal, a bug, a failed write of its
            # pid), never leave a dead mount behind.
            pack.write_pid(lock_fd)
            self._wire(fs, ops)
            trio.run(self._serve, fs, ops, ready, instruments=[self.drain.turn] if self.drain else [])
        finally:
            pyfuse3.close(unmount=not self.unmounted)
            if self.closed:
                self._save_image(p)
            p.volumes.close()
            p.catalog.close()
            os.ftruncate(lock_fd, 0)
            os.close(lock_fd)
        return 0

    def _wire(self, fs: Filesystem, ops: Operations) -> None:
        """Connect packfs to what the fuse shim does for this session (known once mounted)."""
        ops.watch_queue(_fuse_fd())
        ops.no_release = fuseshim.creates_unreleased
        if fuseshim.caches_xattrs():
            fs.ns.table.xattrs_changed = fuseshim.forget_xattrs
            ops.cache_xattrs = fuseshim.cache_xattrs
            ops.note_new_file = fuseshim.note_new
        if fuseshim.answers_listing_ends():
            ops.note_listing_end = fuseshim.note_end
        if fuseshim.answers_metadata():  # (a staged file's GETATTR must reach ops, which absorbs it)
            fuseshim.serve_metadata(fs.ns.table, fs.volumes, self.opts.entry_timeout, self.opts.attr_timeout,
                                    getattr_too=not self.opts.passthrough, atime=self.opts.atime,
                                    prefetch=self.opts.prefetch)
        ops.fallocate_token = fuseshim.fallocate_token()
        if self.opts.passthrough:
            ops.staging = Staging(fs, fs.disk, self.packdir, self.opts.disk_chunk_size, fuseshim)
        if self.drain:
            self.drain.await_request = ops.busypoll.await_request
            self.drain.on_idle = fs.journal.when_idle
            fs.journal.idle_hook = True
            if fuseshim.answers_listing_ends() or fuseshim.caches_xattrs() or fuseshim.answers_metadata():
                self.drain.on_read = ops.busypoll.touch  # requests answered in C keep the loop polling
        if not fuseshim.loaded():
            log.warning("the fuse shim library is not built: directories are opened by a FUSE request, and "
                        "cached writes ask the kernel's getxattr before each write (see fuseshim.py)")
        elif (self.opts.dircache or self.opts.filecache or self.opts.xattrcache or self.opts.metacache) and \
                not fuseshim.installed():
            log.warning("the fuse shim did not take: directories and files are opened by a FUSE request "
                        "(see fuseshim.py)")

    async def _serve(self, fs: Filesystem, ops: Operations, ready: Ready) -> None:
        async def on_control(command: str) -> dict:
            if command == "stats":
                return {"pid": os.getpid(), "version": __version__, "pack_directory": self.packdir,
                        "mountpoint": self.mountpoint,
                        **await fs.stats(), "operations": ops.opstats.report(), "busy_poll_turns": ops.busypoll.spins,
                        "busy_poll_caught": ops.busypoll.caught, "busy_poll_expired": ops.busypoll.expired,
                        "zero_message_opendir": fuseshim.zero_message_opendir(),
                        "zero_message_open": fuseshim.zero_message_open(),
                        "opens_in_shim": fuseshim.opens_in_c(),
                        "opens_answered_in_shim": fuseshim.opens_answered(),
                        "releases_answered_in_shim": fuseshim.releases_answered(),
                        "killpriv_v2": fuseshim.killpriv(), "direct_io_mmap": fuseshim.direct_mmap(),
                        "listings_open": len(ops.listings),
                        "listing_ends_answered_in_shim": fuseshim.ends_answered(),
                        "xattrs_from_shim": fuseshim.caches_xattrs(),
                        "xattrs_answered_in_shim": fuseshim.xattrs_answered(),
                        "listxattrs_answered_in_shim": fuseshim.listxattrs_answered(),
                        "ioctls_counted": fuseshim.installed(),
                        "ioctls_answered_in_shim": fuseshim.ioctls_answered(),
                        "metadata_from_shim": fuseshim.answers_metadata(),
                        **{f"{op}s_answered_in_shim": n for op, n in fuseshim.metadata_answered().items()},
                        "prefetches_in_shim": fuseshim.prefetched(),
                        "fallocate": bool(ops.fallocate_token), "o_tmpfile": fuseshim.serves_tmpfile(),
                        "tmpfiles": fuseshim.tmpfiles(),
                        "passthrough": self._passthrough_stats(ops),
                        "fuse_waits_skipped": self.drain.skipped if self.drain else 0,
                        "device": fs.volumes.timings.report()}
            if command == "commit":  # packfs sync: the kernel sends a FUSE daemon no SYNCFS
                await fs.fsync()
                return {"ok": True}
            if command == "sync":  # packfs umount: commit, then checkpoint so the next mount replays nothing
                await fs.fsync()
                await fs.journal.checkpoint()
                return {"ok": True}
            return {"error": f"unknown command {command!r}"}

        async with trio.open_nursery() as nursery:
            await fs.start(nursery)
            await nursery.start(control.serve, fs.pack.pack_id, on_control)
            if ops.staging is not None:
                await nursery.start(ops.staging.run)
            nursery.start_soon(self._stop_on_signal)
            ready("")
            log.info("serving %s, %.2f s after the daemon started", self.mountpoint, time.monotonic() - self.started)
            await pyfuse3.main(min_tasks=4, max_tasks=self.opts.max_tasks)
            self.unmounted = not self.terminated
            log.info("unmounted; writing the final checkpoint")
            if ops.staging is not None:
                await ops.staging.close()
            await fs.close()
            self.closed = True
            nursery.cancel_scope.cancel()

    @staticmethod
    def _passthrough_stats(ops: Operations) -> dict:
        s = ops.staging
        if s is None:
            return {"active": False}
        return {"active": fuseshim.passthrough(), "staged": s.staged, "open": len(s),
                "absorbed_bytes": s.absorbed_bytes, "refused": s.refused, "shared": s.shared}

    @staticmethod
    def _save_image(p: pack.Pack) -> None:
        """Leave the next mount a namespace image; without one it loads the catalog."""
        started = time.monotonic()
        try:
            size = p.save_image()
        except Exception as e:
            log.warning("no namespace image written (the next mount loads the catalog): %s", e)
            return
        log.info("namespace image written: %d inodes, %.1f MiB in %.2f s", len(p.ns), size / 2**20,
                 time.monotonic() - started)

    async def _stop_on_signal(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                log.info("signal received: unmounting")
                self.terminated = True
                pyfuse3.terminate()
                return
