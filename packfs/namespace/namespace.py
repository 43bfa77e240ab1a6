"""The namespace: inodes, directory entries, xattrs and extent maps, in memory.

It is the only source for lookups, attributes, listings and xattrs, so those never
touch the disk (xattrs may, if the inode table leaves their values in the catalog).
Every mutation is recorded in two change sets: one the journal takes at each commit,
one the catalog takes at each checkpoint. Nothing here does I/O.
The inodes themselves live in an InodeTable (inodes.py); this module gives them
POSIX semantics.
"""
from __future__ import annotations

import errno
import stat
import time
from typing import Callable, Iterable, Iterator

from ..errors import FsError, enoent
from ..store import extents as ext
from .changes import Changes, PendingChanges
from .inoderow import InodeRow
from .inodes import INO_MAX, ROOT, Inode, InodeTable
from .xattrblob import XATTRS_MAX, packed_size

NAME_MAX = 255
CAPABILITY = b"security.capability"  # file capabilities: what a write by another takes away
XATTR_SIZE_MAX = 65536
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
# Makes a whiteout (a 0/0 character device) where the source was, for overlayfs. packfs
# refuses it (EINVAL, as a filesystem without whiteouts does): nothing that runs on a
# Swift device asks for it, and overlayfs then makes its whiteouts with mknod.
RENAME_WHITEOUT = 4
# Changed inodes that make the journal commit without an fsync (in a tree build without
# fsync: a replication pass, a copy). It bounds a META record's size and what a crash
# replays. Taken at once, 20,000 held the event loop 160-330 ms and 4,000 ~50 ms, and
# the build ran as fast (57909c6, 2026-11-26); now such a commit is snapshotted a
# part per turn (Journal._commit_behind).
COMMIT_INODES = 4_000
# A map at least this long is journaled as its edits since the previous commit took it,
# not whole: a database rewritten in place keeps an extent per page it rewrote (41,000
# in a Swift container of a million rows), and packing that whole map for every commit
# took half of the event loop's time under the container's merges.
JOURNAL_EDITS_MIN = 64


class Namespace:
    def __init__(self) -> None:
        self.table = InodeTable()
        self.next_ino = ROOT + 1  # above every inode number ever used (free ones below are reused)
        # Records referred to by more than one extent (after a split); absent means one.
        self.refs: dict[ext.RecordKey, int] = {}
        # Records no extent refers to any more; punched once that fact is durable.
        self.frees: list[ext.RecordKey] = []
        self.journal_changes = Changes()
        self.catalog_changes = PendingChanges()
        # The edits of each long map since a commit last took it (take_extent_edits): an
        # extent mapped, or the size a truncation cut at.
        self.extent_edits: dict[int, list[ext.Extent | int]] = {}
        self.journal_edits_min = JOURNAL_EDITS_MIN  # tests make it small
        # Files O_TMPFILE made and link() has not named yet: the one kind of file with no
        # name that may get one (the kernel asks only for those).
        self.linkable: set[int] = set()
        # Called once COMMIT_INODES inodes changed since the last commit (the journal
        # then commits in the background, so no single commit grows without bound).
        self.on_many_changes: Callable[[], None] = lambda: None

    # -- building -------------------------------------------------------------

    @classmethod
    def fresh(cls, uid: int = 0, gid: int = 0) -> "Namespace":
        ns = cls()
        ns.table.put(ROOT, stat.S_IFDIR | 0o755, uid, gid, time.time_ns())
        root = Inode(ns.table, ROOT)
        root.parent = ROOT
        ns._touch(root)
        return ns

    def load_inode(self, row: InodeRow, strict: bool = True) -> None:
        self.table.load(row, strict)
        self.next_ino = max(self.next_ino, row[0] + 1)

    def load_dirent(self, parent: int, name: bytes, ino: int | None) -> None:
        assert self.is_dir(parent)
        if ino is None:
            self.table.del_child(parent, name)
        else:
            self.table.set_child(parent, name, ino)

    def drop_inode(self, ino: int) -> None:
        self.table.drop(ino)
        self.extent_edits.pop(ino, None)

    def loaded(self) -> None:
        """After loading a checkpoint: collect the free inode numbers, to reuse them."""
        self.table.find_free(self.next_ino)

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

    def take_extent_edits(self, ino: int, wanted: bool) -> list[bytes | int] | None:
        """For a commit's snapshot of a file (journal.snapshot): the map's edits since the
        previous commit took it, packed, if wanted, followed all along and fewer than the
        map's extents; else None, for the whole map. A long map's edits are followed from
        here on. A take whose META may never be written must be forgotten (forget_extent_edits)."""
        edits = self.extent_edits.pop(ino, None)
        extents = self.table.extent_count(ino)
        if extents >= self.journal_edits_min:
            self.extent_edits[ino] = []
        if wanted and edits is not None and len(edits) < extents:
            return ext.pack_edits(edits)
        return None

    def forget_extent_edits(self, inodes: Iterable[int]) -> None:
        """Their next commit logs their maps whole (a commit that took them was given up)."""
        for ino in inodes:
            self.extent_edits.pop(ino, None)

    def take_catalog_changes(self) -> PendingChanges:
        taken, self.catalog_changes = self.catalog_changes, PendingChanges()
        return taken

    def take_frees(self) -> list[ext.RecordKey]:
        taken, self.frees = self.frees, []
        return taken

    def dirent(self, parent: int, name: bytes) -> int | None:
        t = self.table
        return t.child(parent, name) if t.exists(parent) and stat.S_ISDIR(t.mode_of(parent)) else None

    # -- reads ----------------------------------------------------------------

    def get(self, ino: int) -> Inode:
        t = self.table
        if not (0 < ino < len(t.kind) and t.kind[ino]):  # t.exists, inlined: every request calls this
            raise enoent()
        return Inode(t, ino)

    def find(self, ino: int) -> Inode | None:
        return Inode(self.table, ino) if self.table.exists(ino) else None

    def __contains__(self, ino: int) -> bool:
        return self.table.exists(ino)

    def is_dir(self, ino: int) -> bool:
        return self.table.exists(ino) and stat.S_ISDIR(self.table.mode_of(ino))

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
            return Inode(self.table, d.parent)
        ino = d.child(name)
        return Inode(self.table, ino) if ino is not None else None

    def listdir(self, ino: int) -> list[tuple[bytes, int]]:
        return self.dir(ino).children()

    def getxattr(self, ino: int, name: bytes) -> bytes:
        value = self.get(ino).getxattr(name)
        if value is None:
            raise FsError(errno.ENODATA)
        return value

    def plain_xattrs(self, ino: int) -> bytes:
        """All of an inode's xattrs, packed plain (b"" if none): see xattrblob."""
        return self.table.plain_xattrs(ino) or b""

    def listxattr(self, ino: int) -> list[bytes]:
        return self.get(ino).xattr_names()

    def __len__(self) -> int:
        return len(self.table)

    def __iter__(self) -> Iterator[Inode]:
        t = self.table
        return (Inode(t, ino) for ino in t.inos())

    def max_ino(self) -> int:
        return max(self.table.inos(), default=ROOT)

    # -- namespace mutations --------------------------------------------------

    def _new_name(self, parent: int, name: bytes) -> Inode:
        if len(name) > NAME_MAX:
            raise FsError(errno.ENAMETOOLONG)
        if name in (b".", b"..") or b"/" in name or b"\0" in name or not name:
            raise FsError(errno.EEXIST if name in (b".", b"..") else errno.EINVAL)
        d = self.dir(parent)
        if d.nlink == 0:
            raise enoent()  # a removed directory accepts no new entries
        if d.child(name) is not None:
            raise FsError(errno.EEXIST)
        return d

    def _free_ino(self) -> int:
        """The last freed inode number, or a new one. A replayed commit may have taken a
        number back after it was freed, so each is checked."""
        free, exists = self.table.free, self.table.exists
        while free:
            ino = free.pop()
            if not exists(ino):
                return ino
        if self.next_ino >= INO_MAX:
            raise FsError(errno.ENOSPC)  # every inode number is in use
        self.next_ino += 1
        return self.next_ino - 1

    def _link_entry(self, d: Inode, name: bytes, node: Inode, now: int) -> None:
        d.set_child(name, node.ino)
        d.modified(now)
        self._touch(d)
        self._touch_dirent(d.ino, name)

    def _unlink_entry(self, d: Inode, name: bytes, now: int) -> None:
        d.del_child(name)
        d.modified(now)
        self._touch(d)
        self._touch_dirent(d.ino, name)

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               rdev: int = 0, target: bytes | None = None) -> Inode:
        """Create a file, directory, symlink or special file under parent."""
        d = self._new_name(parent, name)
        now = time.time_ns()
        ino = self._free_ino()
        self.table.put(ino, mode, uid, gid, now)
        node = Inode(self.table, ino)
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
        self._touch(node)
        self._link_entry(d, name, node, now)
        return node

    def create_unlinked(self, parent: int, mode: int, uid: int, gid: int) -> Inode:
        """A regular file with no name, as open(O_TMPFILE) makes in parent: the directory is
        not changed, and the file goes when nothing holds it unless link() names it first."""
        d = self.dir(parent)
        if d.nlink == 0:
            raise enoent()
        ino = self._free_ino()
        self.table.put(ino, mode, uid, gid, time.time_ns())
        node = Inode(self.table, ino)
        node.nlink = 0
        if d.mode & stat.S_ISGID:
            node.gid = d.gid
        self.linkable.add(ino)
        self._touch(node)
        return node

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        node = self.get(ino)
        if node.is_dir:
            raise FsError(errno.EPERM)
        if node.nlink == 0 and ino not in self.linkable:
            raise enoent()  # unlinked: only a file O_TMPFILE made may be named (once)
        d = self._new_name(parent, name)
        self.linkable.discard(ino)
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
        if node.has_children():
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
            b = self.table.parent[b]

    def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes,
               flags: int = 0) -> Inode | None:
        """Atomically move old to new. Returns a replaced inode that lost its last name.
        A flag packfs does not serve is refused, never ignored: RENAME_WHITEOUT would leave
        no whiteout otherwise."""
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == RENAME_NOREPLACE | RENAME_EXCHANGE:
            raise FsError(errno.EINVAL)
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
            if dst == src:
                return None  # two names of one inode: POSIX says do nothing
            if src.is_dir and not dst.is_dir:
                raise FsError(errno.ENOTDIR)
            if not src.is_dir and dst.is_dir:
                raise FsError(errno.EISDIR)
            if dst.is_dir and dst.has_children():
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
        if src.is_dir and od != nd:
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
            d.modified(now)
            self._touch(d)
            self._touch_dirent(d.ino, name)
        if od != nd and src.is_dir != dst.is_dir:
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

    def remove_privileges(self, node: Inode, setid: bool) -> None:
        """What writing, truncating or chowning a file takes from it, as Linux does: its
        file capabilities, and with setid its set-user-ID bit and its set-group-ID bit if
        the group may execute it (without that bit it marks mandatory locking). The
        kernel leaves this to packfs (HANDLE_KILLPRIV_V2, see fuseshim.py); the caller
        says whether the writer may keep the set-ID bits (root: CAP_FSETID)."""
        kill = (stat.S_ISUID | (stat.S_ISGID if node.mode & stat.S_IXGRP else 0)) if setid else 0
        caps = node.getxattr(CAPABILITY) is not None
        if not (node.mode & kill or caps):
            return
        node.mode &= ~kill
        if caps:
            x = node.xattrs
            del x[CAPABILITY]
            node.xattrs = x
        node.ctime = time.time_ns()
        self._touch(node)

    def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.setxattrs(ino, [(name, value)])

    def setxattrs(self, ino: int, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Set xattrs in order, as one change: all or, on an error, none. `packfs import`
        sets a file's all at once: one by one, each unpacked and packed again those set
        before it."""
        node = self.get(ino)
        x = node.xattrs or {}
        for name, value in items:
            if not name or len(name) > NAME_MAX:
                raise FsError(errno.ERANGE)
            if len(value) > XATTR_SIZE_MAX:
                raise FsError(errno.E2BIG)
            x[name] = bytes(value)
        if packed_size(x) > XATTRS_MAX:
            raise FsError(errno.ENOSPC)  # as XFS and ext4 say when an inode's xattr space is full
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
        self._edited(node.ino, e)
        self._touch(node)

    def punch(self, node: Inode, start: int, end: int) -> None:
        """Make [start, end) of a file a hole (fallocate's PUNCH_HOLE); its size stays."""
        extents = node.extents
        if extents:
            _, dropped, split = ext.punch(extents, start, end)
            node.extents = extents
            self._account(dropped, split)
        self.extent_edits.pop(node.ino, None)  # no edit says "a hole here": the next commit logs the map whole
        self._touch(node)

    def truncate_extents(self, node: Inode, size: int) -> None:
        extents = node.extents
        if extents:
            _, dropped, split = ext.punch(extents, size, ext.INFINITY)
            node.extents = extents
            self._account(dropped, split)
        self._edited(node.ino, size)
        self._touch(node)

    def _edited(self, ino: int, edit: ext.Extent | int) -> None:
        edits = self.extent_edits.get(ino)
        if edits is None:
            return
        if len(edits) < self.table.extent_count(ino):
            edits.append(edit)
        else:  # the next commit logs the map whole: the edits would only take memory
            del self.extent_edits[ino]

    def release(self, node: Inode) -> bool:
        """Forget an inode with no names, open handles or kernel references; True if it went."""
        if node.nlink > 0 or node.opens > 0 or node.lookups > 0 or not self.table.exists(node.ino):
            return False
        dead = node.extent_list()
        if dead:
            self._account([ext.key(e) for e in dead], [])
            node.extents = []
        self.table.drop(node.ino)
        self.extent_edits.pop(node.ino, None)
        self.linkable.discard(node.ino)
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
