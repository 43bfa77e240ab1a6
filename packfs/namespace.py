"""The inode table: inodes, directory entries, xattrs and extent maps, in memory.

It is the only source for lookups, attributes, listings and xattrs, so those never
touch the disk. Every mutation is recorded in two change sets: one the journal takes
at each commit, one the catalog takes at each checkpoint. Nothing here does I/O.
"""
from __future__ import annotations

import errno
import stat
import struct
import time
import zlib
from typing import Callable, Iterable, Iterator

from . import extents as ext
from .errors import FsError, enoent

ROOT = 1
NAME_MAX = 255
XATTR_SIZE_MAX = 65536
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

# A snapshot of one inode, as the journal and the catalog store it:
# (ino, mode, uid, gid, nlink, size, atime, mtime, ctime, rdev, target, xattrs, extents, parent)
# with xattrs and extents in their packed forms (see pack_xattrs and pack_extents).
InodeRow = tuple
Entries = tuple | dict | None  # see Inode

_EXTENT = struct.Struct("<QIIQII")
_XHEAD = struct.Struct("<HI")
COMMIT_INODES = 20_000  # changed inodes that make the journal commit without an fsync (a stage of 20k takes ~60 ms)
PACKED_EXTENTS_MAX = 8  # longer extent lists stay Python lists: cheap to edit
_SHARED: dict[int, int] = {}  # one object per distinct mode, uid and gid (see Inode.from_row)


def pack_extents(extents: list | None) -> bytes | None:
    if extents is None:
        return None
    return b"".join([_EXTENT.pack(*e) for e in extents])


def unpack_extents(blob: bytes | None) -> list | None:
    return None if blob is None else list(_EXTENT.iter_unpack(blob))


# Packed xattrs of XATTR_COMPRESS_MIN bytes or more are stored raw-deflated with this
# preset dictionary (Swift's metadata keys and pickle framing), behind a prefix no plain
# blob can start with (its first field is a name length of at most 255). Swift's
# ~270 B of pickled metadata shrink to ~110 B. On-disk format: never change these bytes.
_XZ_PREFIX = b"\xff\xff"
_XZ_DICT = (b"\x13\x00\x00\x00\x00\x00user.swift.metadata\x80\x02}q\x00(X\x04\x00\x00\x00nameq\x01X"
            b"\x0b\x00\x00\x00X-Timestampq\x03X\x0c\x00\x00\x00Content-Typeq\x05X\x18\x00\x00\x00"
            b"application/octet-streamq\x06X\x04\x00\x00\x00ETagq\x07X \x00\x00\x00X\x0e\x00\x00\x00"
            b"Content-Lengthq\x09X\x04\x00\x00\x004096X\x14\x00\x00\x00X-Object-Meta-X-Object-Sysmeta-"
            b"X-Backend-Durable-TimestampX-Static-Large-Objectu.\x00user.swift.metadata_checksum/AUTH_")
XATTR_COMPRESS_MIN = 128


def pack_xattrs(xattrs: dict[bytes, bytes] | None) -> bytes | None:
    if not xattrs:
        return None
    blob = b"".join([_XHEAD.pack(len(k), len(v)) + k + v for k, v in xattrs.items()])
    if len(blob) >= XATTR_COMPRESS_MIN:
        c = zlib.compressobj(6, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, _XZ_DICT)
        packed = c.compress(blob) + c.flush()
        if len(packed) + len(_XZ_PREFIX) < len(blob):
            return _XZ_PREFIX + packed
    return blob


def _plain(blob: bytes) -> bytes:
    """A packed xattr blob, decompressed if it was stored compressed."""
    if blob[:2] == _XZ_PREFIX:
        return zlib.decompressobj(-15, _XZ_DICT).decompress(memoryview(blob)[2:])
    return blob


def _iter_xattrs(blob: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(name, value start, value end) for each xattr in a plain packed blob."""
    pos = 0
    while pos < len(blob):
        nlen, vlen = _XHEAD.unpack_from(blob, pos)
        pos += _XHEAD.size
        yield blob[pos:pos + nlen], pos + nlen, pos + nlen + vlen
        pos += nlen + vlen


def unpack_xattrs(blob: bytes | None) -> dict[bytes, bytes] | None:
    if not blob:
        return None
    blob = _plain(blob)
    return {name: blob[a:b] for name, a, b in _iter_xattrs(blob)}


class Inode:
    """One file, directory, symlink or special file, kept small in RAM.

    Xattrs and extents rest in their packed forms (bytes) and are unpacked only to be
    edited: most inodes are written once and then only read or listed. The `xattrs`
    and `extents` properties unpack in place so callers may edit what they get; the
    namespace packs them again after each edit.

    A directory's `entries` are () when it is empty, one (name, ino) pair when it holds
    one name, and a dict beyond that: most of Swift's suffix and hash directories hold
    one name, and a dict costs about 250 B where the pair costs 72. Use the child
    methods rather than `entries` itself; `entries` is None for non-directories.
    """

    __slots__ = ("ino", "mode", "uid", "gid", "nlink", "size", "atime", "mtime", "ctime", "rdev",
                 "target", "_xattrs", "_extents", "entries", "parent", "opens", "lookups", "wbuf")

    def __init__(self, ino: int, mode: int, uid: int, gid: int, now: int) -> None:
        self.ino = ino
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.nlink = 2 if stat.S_ISDIR(mode) else 1
        self.size = 0
        self.atime = self.mtime = self.ctime = now
        self.rdev = 0
        self.target: bytes | None = None
        self._xattrs: bytes | dict[bytes, bytes] | None = None
        self._extents: bytes | list[ext.Extent] | None = b"" if stat.S_ISREG(mode) else None
        self.entries: Entries = () if stat.S_ISDIR(mode) else None
        self.parent = 0
        self.opens = 0  # open file handles
        self.lookups = 0  # the kernel's references (FUSE lookup count), dropped by forget
        self.wbuf = None  # writeback.Buffer while the file has unflushed data

    # -- directory entries ----------------------------------------------------------

    def child(self, name: bytes) -> int | None:
        e = self.entries
        if type(e) is dict:
            return e.get(name)
        return e[1] if e and e[0] == name else None  # type: ignore[index,return-value]

    def children(self) -> list[tuple[bytes, int]]:
        """The (name, ino) pairs of a directory; [] for anything else."""
        e = self.entries
        if type(e) is dict:
            return list(e.items())
        return [e] if e else []  # type: ignore[list-item]

    def set_child(self, name: bytes, ino: int) -> None:
        e = self.entries
        if type(e) is dict:
            e[name] = ino
        elif not e or e[0] == name:  # type: ignore[index]
            self.entries = (name, ino)
        else:
            self.entries = {e[0]: e[1], name: ino}  # type: ignore[index]

    def del_child(self, name: bytes) -> None:
        """Remove a name if present, shrinking back to the compact forms."""
        e = self.entries
        if type(e) is dict:
            e.pop(name, None)
            if len(e) <= 1:
                self.entries = next(iter(e.items())) if e else ()
        elif e and e[0] == name:  # type: ignore[index]
            self.entries = ()

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def extents(self) -> list[ext.Extent] | None:
        """The extent map, unpacked in place for editing."""
        e = self._extents
        if isinstance(e, bytes):
            e = self._extents = unpack_extents(e)
        return e

    @extents.setter
    def extents(self, value: list[ext.Extent] | None) -> None:
        self._extents = value
        self.pack()

    def extent_list(self) -> list[ext.Extent]:
        """The extent map for reading, without unpacking it in place."""
        e = self._extents
        if isinstance(e, bytes):
            return list(_EXTENT.iter_unpack(e))
        return e or []

    @property
    def xattrs(self) -> dict[bytes, bytes] | None:
        """The xattrs, unpacked in place for editing."""
        x = self._xattrs
        if isinstance(x, bytes):
            x = self._xattrs = unpack_xattrs(x)
        return x

    @xattrs.setter
    def xattrs(self, value: dict[bytes, bytes] | None) -> None:
        self._xattrs = value or None
        self.pack()

    def getxattr(self, name: bytes) -> bytes | None:
        x = self._xattrs
        if isinstance(x, bytes):
            x = _plain(x)
            for n, a, b in _iter_xattrs(x):
                if n == name:
                    return x[a:b]
            return None
        return x.get(name) if x else None

    def xattr_names(self) -> list[bytes]:
        x = self._xattrs
        if isinstance(x, bytes):
            return [n for n, _, _ in _iter_xattrs(_plain(x))]
        return list(x or ())

    def pack(self) -> None:
        """Return edited xattrs and short extent maps to their packed forms."""
        if isinstance(self._xattrs, dict):
            self._xattrs = pack_xattrs(self._xattrs)
        e = self._extents
        if isinstance(e, list) and len(e) <= PACKED_EXTENTS_MAX:
            self._extents = pack_extents(e)

    def row(self) -> InodeRow:
        x, e = self._xattrs, self._extents
        return (self.ino, self.mode, self.uid, self.gid, self.nlink, self.size, self.atime, self.mtime,
                self.ctime, self.rdev, self.target, x if not isinstance(x, dict) else pack_xattrs(x),
                e if not isinstance(e, list) else pack_extents(e), self.parent)

    @classmethod
    def from_row(cls, row: InodeRow) -> "Inode":
        node = cls.__new__(cls)
        (node.ino, mode, uid, gid, node.nlink, node.size, atime, mtime,
         ctime, node.rdev, node.target, node._xattrs, node._extents, node.parent) = row
        # Each integer read from a row is an object of its own (28-32 B): share the few
        # distinct modes and owners, and one time object where times are equal.
        node.mode = _SHARED.setdefault(mode, mode)
        node.uid = _SHARED.setdefault(uid, uid)
        node.gid = _SHARED.setdefault(gid, gid)
        node.mtime = mtime
        node.ctime = mtime if ctime == mtime else ctime
        node.atime = mtime if atime == mtime else atime
        node.entries = () if stat.S_ISDIR(mode) else None
        node.opens = node.lookups = 0
        node.wbuf = None
        return node


class Changes:
    """What changed since someone last took it: inodes, directory entries, record refs."""

    __slots__ = ("inodes", "dirents", "refs")

    def __init__(self) -> None:
        self.inodes: set[int] = set()
        self.dirents: set[tuple[int, bytes]] = set()
        self.refs: set[ext.RecordKey] = set()

    def __bool__(self) -> bool:
        return bool(self.inodes or self.dirents or self.refs)

    def merge(self, other: "Changes") -> None:
        self.inodes |= other.inodes
        self.dirents |= other.dirents
        self.refs |= other.refs


class Namespace:
    def __init__(self) -> None:
        self.inodes: dict[int, Inode] = {}
        self.next_ino = ROOT + 1
        # Records referred to by more than one extent (after a split); absent means one.
        self.refs: dict[ext.RecordKey, int] = {}
        # Records no extent refers to any more; punched once that fact is durable.
        self.frees: list[ext.RecordKey] = []
        self.journal_changes = Changes()
        self.catalog_changes = Changes()
        # Called once COMMIT_INODES inodes changed since the last commit (the journal
        # then commits in the background, so no single commit grows without bound).
        self.on_many_changes: Callable[[], None] = lambda: None

    # -- building -------------------------------------------------------------

    @classmethod
    def fresh(cls, uid: int = 0, gid: int = 0) -> "Namespace":
        ns = cls()
        root = Inode(ROOT, stat.S_IFDIR | 0o755, uid, gid, time.time_ns())
        root.parent = ROOT
        ns.inodes[ROOT] = root
        ns._touch(root)
        return ns

    def load_inode(self, row: InodeRow) -> None:
        node = Inode.from_row(row)
        if node.is_dir:
            old = self.inodes.get(node.ino)
            node.entries = old.entries if old is not None and old.entries is not None else ()
        self.inodes[node.ino] = node
        self.next_ino = max(self.next_ino, node.ino + 1)

    def load_dirent(self, parent: int, name: bytes, ino: int | None) -> None:
        d = self.inodes[parent]
        assert d.entries is not None
        if ino is None:
            d.del_child(name)
        else:
            d.set_child(name, ino)

    def drop_inode(self, ino: int) -> None:
        self.inodes.pop(ino, None)

    def set_ref(self, key: ext.RecordKey, count: int) -> None:
        if count > 1:
            self.refs[key] = count
        else:
            self.refs.pop(key, None)

    # -- change tracking ------------------------------------------------------

    def _touch(self, node: Inode) -> None:
        changed = self.journal_changes.inodes
        changed.add(node.ino)
        if len(changed) == COMMIT_INODES:
            self.on_many_changes()

    def _touch_dirent(self, parent: int, name: bytes) -> None:
        self.journal_changes.dirents.add((parent, name))

    def take_journal_changes(self) -> Changes:
        taken, self.journal_changes = self.journal_changes, Changes()
        self.catalog_changes.merge(taken)
        return taken

    def take_catalog_changes(self) -> Changes:
        taken, self.catalog_changes = self.catalog_changes, Changes()
        return taken

    def take_frees(self) -> list[ext.RecordKey]:
        taken, self.frees = self.frees, []
        return taken

    def dirent(self, parent: int, name: bytes) -> int | None:
        node = self.inodes.get(parent)
        return node.child(name) if node is not None and node.entries is not None else None

    # -- reads ----------------------------------------------------------------

    def get(self, ino: int) -> Inode:
        node = self.inodes.get(ino)
        if node is None:
            raise enoent()
        return node

    def dir(self, ino: int) -> Inode:
        node = self.get(ino)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR)
        return node

    def lookup(self, parent: int, name: bytes) -> Inode | None:
        if len(name) > NAME_MAX:
            raise FsError(errno.ENAMETOOLONG)
        d = self.dir(parent)
        if name == b".":
            return d
        if name == b"..":
            return self.inodes[d.parent]
        ino = d.child(name)
        return self.inodes[ino] if ino is not None else None

    def listdir(self, ino: int) -> list[tuple[bytes, int]]:
        return self.dir(ino).children()

    def getxattr(self, ino: int, name: bytes) -> bytes:
        value = self.get(ino).getxattr(name)
        if value is None:
            raise FsError(errno.ENODATA)
        return value

    def listxattr(self, ino: int) -> list[bytes]:
        return self.get(ino).xattr_names()

    def __len__(self) -> int:
        return len(self.inodes)

    def __iter__(self) -> Iterator[Inode]:
        return iter(self.inodes.values())

    # -- namespace mutations --------------------------------------------------

    def _new_name(self, parent: int, name: bytes) -> Inode:
        if len(name) > NAME_MAX:
            raise FsError(errno.ENAMETOOLONG)
        if name in (b".", b"..") or b"/" in name or not name:
            raise FsError(errno.EEXIST if name in (b".", b"..") else errno.EINVAL)
        d = self.dir(parent)
        if d.nlink == 0:
            raise enoent()  # a removed directory accepts no new entries
        if d.child(name) is not None:
            raise FsError(errno.EEXIST)
        return d

    def _link_entry(self, d: Inode, name: bytes, node: Inode, now: int) -> None:
        d.set_child(name, node.ino)
        d.mtime = d.ctime = now
        self._touch(d)
        self._touch_dirent(d.ino, name)

    def _unlink_entry(self, d: Inode, name: bytes, now: int) -> None:
        d.del_child(name)
        d.mtime = d.ctime = now
        self._touch(d)
        self._touch_dirent(d.ino, name)

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               rdev: int = 0, target: bytes | None = None) -> Inode:
        """Create a file, directory, symlink or special file under parent."""
        d = self._new_name(parent, name)
        now = time.time_ns()
        node = Inode(self.next_ino, mode, uid, gid, now)
        self.next_ino += 1
        node.rdev = rdev
        if target is not None:
            node.target = target
            node.size = len(target)
        if node.is_dir:
            node.parent = d.ino
            d.nlink += 1
            if d.mode & stat.S_ISGID:  # BSD group semantics of setgid directories
                node.gid = d.gid
                node.mode |= stat.S_ISGID
        elif d.mode & stat.S_ISGID:
            node.gid = d.gid
        self.inodes[node.ino] = node
        self._touch(node)
        self._link_entry(d, name, node, now)
        return node

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        node = self.get(ino)
        if node.is_dir:
            raise FsError(errno.EPERM)
        if node.nlink == 0:
            raise enoent()
        d = self._new_name(parent, name)
        now = time.time_ns()
        node.nlink += 1
        node.ctime = now
        self._touch(node)
        self._link_entry(d, name, node, now)
        return node

    def unlink(self, parent: int, name: bytes) -> Inode:
        """Remove a non-directory name; the caller releases the inode when unused."""
        d = self.dir(parent)
        node = self.lookup(parent, name)
        if node is None:
            raise enoent()
        if node.is_dir:
            raise FsError(errno.EISDIR)
        now = time.time_ns()
        self._unlink_entry(d, name, now)
        node.nlink -= 1
        node.ctime = now
        self._touch(node)
        return node

    def rmdir(self, parent: int, name: bytes) -> Inode:
        if name == b".":
            raise FsError(errno.EINVAL)
        if name == b"..":
            raise FsError(errno.ENOTEMPTY)
        d = self.dir(parent)
        node = self.lookup(parent, name)
        if node is None:
            raise enoent()
        if not node.is_dir:
            raise FsError(errno.ENOTDIR)
        if node.entries:
            raise FsError(errno.ENOTEMPTY)
        now = time.time_ns()
        self._unlink_entry(d, name, now)
        d.nlink -= 1
        node.nlink = 0
        node.ctime = now
        self._touch(node)
        return node

    def _is_ancestor(self, a: int, b: int) -> bool:
        """True if directory a is b or one of b's ancestors."""
        while True:
            if a == b:
                return True
            if b == ROOT:
                return False
            b = self.inodes[b].parent

    def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes,
               flags: int = 0) -> Inode | None:
        """Atomically move old to new. Returns a replaced inode that lost its last name."""
        if len(new_name) > NAME_MAX:
            raise FsError(errno.ENAMETOOLONG)
        if old_name in (b".", b"..") or new_name in (b".", b".."):
            raise FsError(errno.EBUSY if old_name in (b".", b"..") else errno.EINVAL)
        od, nd = self.dir(old_parent), self.dir(new_parent)
        src = self.lookup(old_parent, old_name)
        if src is None:
            raise enoent()
        dst = self.lookup(new_parent, new_name)
        if src.is_dir and self._is_ancestor(src.ino, nd.ino):
            raise FsError(errno.EINVAL)
        if flags & RENAME_EXCHANGE:
            if dst is None:
                raise enoent()
            if dst.is_dir and self._is_ancestor(dst.ino, od.ino):
                raise FsError(errno.EINVAL)
            return self._exchange(od, old_name, src, nd, new_name, dst)
        if dst is not None:
            if flags & RENAME_NOREPLACE:
                raise FsError(errno.EEXIST)
            if dst is src:
                return None  # two names of one inode: POSIX says do nothing
            if src.is_dir and not dst.is_dir:
                raise FsError(errno.ENOTDIR)
            if not src.is_dir and dst.is_dir:
                raise FsError(errno.EISDIR)
            if dst.is_dir and dst.entries:
                raise FsError(errno.ENOTEMPTY)
        now = time.time_ns()
        replaced = None
        if dst is not None:
            self._unlink_entry(nd, new_name, now)
            if dst.is_dir:
                nd.nlink -= 1
                dst.nlink = 0
            else:
                dst.nlink -= 1
            dst.ctime = now
            self._touch(dst)
            replaced = dst
        self._unlink_entry(od, old_name, now)
        self._link_entry(nd, new_name, src, now)
        if src.is_dir and od is not nd:
            od.nlink -= 1
            nd.nlink += 1
            src.parent = nd.ino
        src.ctime = now
        self._touch(src)
        return replaced

    def _exchange(self, od: Inode, old_name: bytes, src: Inode, nd: Inode, new_name: bytes, dst: Inode) -> None:
        now = time.time_ns()
        od.set_child(old_name, dst.ino)
        nd.set_child(new_name, src.ino)
        for d, name in ((od, old_name), (nd, new_name)):
            d.mtime = d.ctime = now
            self._touch(d)
            self._touch_dirent(d.ino, name)
        if od is not nd and src.is_dir != dst.is_dir:
            moved_in, moved_out = (nd, od) if src.is_dir else (od, nd)
            moved_in.nlink += 1
            moved_out.nlink -= 1
        if src.is_dir:
            src.parent = nd.ino
        if dst.is_dir:
            dst.parent = od.ino
        for node in (src, dst):
            node.ctime = now
            self._touch(node)
        return None

    # -- attributes -------------------------------------------------------------

    def touch(self, node: Inode) -> None:
        """Mark an inode changed after the caller edited its attributes."""
        self._touch(node)

    def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        if not name or len(name) > NAME_MAX:
            raise FsError(errno.ERANGE)
        if len(value) > XATTR_SIZE_MAX:
            raise FsError(errno.E2BIG)
        node = self.get(ino)
        x = node.xattrs or {}
        x[name] = bytes(value)
        node.xattrs = x
        node.ctime = time.time_ns()
        self._touch(node)

    def removexattr(self, ino: int, name: bytes) -> None:
        node = self.get(ino)
        x = node.xattrs
        if not x or name not in x:
            raise FsError(errno.ENODATA)
        del x[name]
        node.xattrs = x
        node.ctime = time.time_ns()
        self._touch(node)

    # -- contents ---------------------------------------------------------------

    def map_extent(self, node: Inode, e: ext.Extent) -> None:
        """Point [e.offset, +e.length) of a file at a freshly written record."""
        extents = node.extents
        assert extents is not None
        _, dropped, split = ext.insert(extents, e)
        node.extents = extents
        self._account(dropped, split)
        self._touch(node)

    def truncate_extents(self, node: Inode, size: int) -> None:
        extents = node.extents
        if extents:
            _, dropped, split = ext.punch(extents, size, ext.INFINITY)
            node.extents = extents
            self._account(dropped, split)
        self._touch(node)

    def release(self, node: Inode) -> bool:
        """Forget an inode with no names, open handles or kernel references; True if it went."""
        if node.nlink > 0 or node.opens > 0 or node.lookups > 0 or node.ino not in self.inodes:
            return False
        dead = node.extent_list()
        if dead:
            self._account([ext.key(e) for e in dead], [])
            node.extents = []
        del self.inodes[node.ino]
        self._touch(node)
        return True

    def _account(self, dropped: Iterable[ext.RecordKey], split: Iterable[ext.RecordKey]) -> None:
        changed = self.journal_changes.refs
        for k in split:
            self.refs[k] = self.refs.get(k, 1) + 1
            changed.add(k)
        for k in dropped:
            n = self.refs.get(k, 1) - 1
            if k in self.refs:
                changed.add(k)
            if n <= 0:
                self.frees.append(k)
            if n <= 1:
                self.refs.pop(k, None)
            else:
                self.refs[k] = n
