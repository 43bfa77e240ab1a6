"""Mount options: parsing, defaults and their documentation in one place."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import TypeVar

T = TypeVar("T")
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class OptionError(ValueError):
    pass


def parse_size(text: str) -> int:
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = _UNITS.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in _UNITS else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise OptionError(f"not a size: {text!r}") from None
    if value <= 0:
        raise OptionError(f"size must be positive: {text!r}")
    return value


def _knob(default: T, doc: str) -> T:
    """A mount option's default and its one-line documentation (`packfs mount --help`)."""
    return field(default=default, metadata={"doc": doc})


@dataclass
class Options:
    """Every knob, with its default and a line of documentation; README.md says more of each."""

    disk_chunk_size: int = _knob(1 << 20, "appends reach the disk in pieces of this size")
    max_dirty: int = _knob(256 << 20, "unflushed bytes per mount before writers wait")
    volume_size: int = _knob(4 << 30, "roll over to a new volume file past this size")
    checkpoint_bytes: int = _knob(1 << 30, "checkpoint the catalog after this much log")
    commit_interval: float = _knob(5.0, "commit what no fsync has after this many seconds (0: never)")
    cache_size: int = _knob(64 << 20, "verified-record read cache")
    entry_timeout: float = _knob(300.0, "kernel dentry cache lifetime (packfs is the only writer)")
    attr_timeout: float = _knob(300.0, "kernel attribute cache lifetime")
    writeback_cache: bool = _knob(False, "kernel writeback cache (large objects gain, small ones pay)")
    direct_writes: bool = _knob(True, "write-only and creating handles bypass the page cache")
    allow_other: bool = _knob(os.geteuid() == 0, "let other users (Swift's) use a root mount")
    max_tasks: int = _knob(64, "concurrent pyfuse3 request tasks")
    busy_poll_us: int = _knob(100, "the loop polls this long after a request before sleeping")
    drain: int = _knob(8, "queued requests read back to back before the loop yields")
    prefetch: bool = _knob(True, "a file's first xattr read starts the disk read of its data")
    dircache: bool = _knob(True, "directories open without a request; the kernel caches listings")
    filecache: bool = _knob(True, "files open without a request (no OPEN, no RELEASE)")
    xattrcache: bool = _knob(True, "getxattr answered in C from the xattrs last read")
    metacache: bool = _knob(True, "lookup, getattr, whole listings and warm reads of whole records answered in C "
                                  "from the inode table (fuse shim)")
    xattrs_in_memory: bool = _knob(False, "keep every xattr value in memory (off: checkpointed values are read "
                                          "from their records or the catalog)")
    tmpfile: bool = _knob(True, "open(O_TMPFILE) makes a file with no name (fuse shim)")
    fallocate: bool = _knob(True, "fallocate(2): punch holes, check space (fuse shim)")
    passthrough: bool = _knob(False, "the kernel writes O_TMPFILE files to staging files (staging.py)")
    # Access times, set by packfs (the kernel leaves a FUSE file's atime to it): a read, a
    # listing from its start or a readlink sets atime to now under `relatime` if it is older
    # than mtime or ctime or a day old, under `strictatime` always, under `noatime` never
    # (recommended for Swift devices, as for XFS: each update is an inode change to commit).
    atime: str = _knob("relatime", "relatime, strictatime or noatime (given as that option); noatime for Swift")
    dev: bool = _knob(False, "device nodes may be opened (the kernel's nodev otherwise)")
    suid: bool = _knob(False, "set-user-ID and set-group-ID bits take effect on exec")
    exec: bool = _knob(True, "programs may be run from the mount (the kernel's noexec otherwise)")
    debug: bool = _knob(False, "log every request")

    _SIZES = ("disk_chunk_size", "max_dirty", "volume_size", "checkpoint_bytes", "cache_size")
    ATIME_MODES = ("relatime", "strictatime", "noatime")

    @classmethod
    def parse(cls, text: str | None) -> "Options":
        opts = cls()
        known = {f.name: f for f in fields(cls)}
        for item in filter(None, (text or "").split(",")):
            name, _, value = item.partition("=")
            name = name.strip()
            if name in ("rw", "defaults", "auto", "noauto", "user", "nouser", "_netdev", "nofail"):
                continue  # fstab and mount(8) options that mean nothing here
            if name in cls.ATIME_MODES or name == "atime":
                if value:
                    raise OptionError(f"{name} takes no value")
                # mount(8)'s `atime` only undoes `noatime`: the kernel's default, relatime, applies.
                opts.atime = name if name != "atime" else "relatime" if opts.atime == "noatime" else opts.atime
                continue
            if name.startswith("no") and name[2:] in known and known[name[2:]].type in ("bool", bool) and not value:
                setattr(opts, name[2:], False)
                continue
            field = known.get(name)
            if field is None or name.startswith("_"):
                raise OptionError(f"unknown mount option {name!r}")
            setattr(opts, name, cls._convert(name, field.type, value))
        if opts.disk_chunk_size > 64 << 20:
            raise OptionError("disk_chunk_size must be at most 64M")
        if opts.volume_size > 4 << 30:
            raise OptionError("volume_size must be at most 4G (the inode table addresses a small object's "
                              "record by its 4 KiB page in a volume's first 4 GiB)")
        if opts.busy_poll_us < 0:
            raise OptionError("busy_poll_us must be 0 (off) or a positive number of microseconds")
        if not 0 <= opts.commit_interval < math.inf:
            raise OptionError("commit_interval must be 0 (off) or a number of seconds")
        if opts.drain < 0:
            raise OptionError("drain must be 0 (off) or a positive number of requests")
        if opts.passthrough and opts.writeback_cache:
            raise OptionError("passthrough and writeback_cache exclude each other (the kernel takes one or the other)")
        if opts.passthrough and not opts.tmpfile:
            raise OptionError("passthrough stages the files open(O_TMPFILE) makes: it needs tmpfile")
        if opts.max_dirty < 2 * opts.disk_chunk_size:
            raise OptionError("max_dirty must be at least twice disk_chunk_size")
        return opts

    @classmethod
    def _convert(cls, name: str, typ: object, value: str) -> object:
        if typ in ("bool", bool):
            if value in ("", "1", "yes", "true", "on"):
                return True
            if value in ("0", "no", "false", "off"):
                return False
            raise OptionError(f"{name} takes no value or yes/no, not {value!r}")
        if not value:
            raise OptionError(f"{name} needs a value, as in {name}=...")
        if name in cls._SIZES:
            return parse_size(value)
        try:
            return float(value) if typ in ("float", float) else int(value)
        except ValueError:
            raise OptionError(f"{name}={value!r} is not a number") from None


def _shown(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if name in Options._SIZES and isinstance(value, int):
        for unit, mult in reversed(_UNITS.items()):
            if value % mult == 0:
                return f"{value // mult}{unit.upper()}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe() -> str:
    """Every mount option, its default and its documentation, a line each: `packfs mount --help`
    prints this, so the list cannot drift from the options themselves."""
    rows = [(f.name if f.type in ("bool", bool) else f"{f.name}={'MODE' if f.type in ('str', str) else 'N'}",
             _shown(f.name, f.default), f.metadata["doc"]) for f in fields(Options)]
    width, dwidth = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    lines = [f"  {opt:<{width}}  {default:<{dwidth}}  {doc}" for opt, default, doc in rows]
    return ("mount options (-o a,b=N,...; sizes take K, M, G; a switch is turned off as noNAME),\n"
            "with their defaults:\n" + "\n".join(lines))
