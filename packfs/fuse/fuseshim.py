"""A C library that asks libfuse for what packfs needs and pyfuse3 does not (_fuseshim.c).

Zero-message opendir (option dircache): every directory a Swift operation touches is
opened, to list it and to fsync it after a change. Through pyfuse3 each open costs two
round trips (OPENDIR, RELEASEDIR) and each listing two READDIRs, ~40 us each: 8 of a 4
KiB PUT's 46 requests, 4 of a GET's 13, and 4 per directory of a replicator's walk.
Kernels since 5.1 stop sending OPENDIR and RELEASEDIR once an opendir answers ENOSYS,
and then cache each listing until the directory changes. pyfuse3 cannot use that: its
readdir is given the handle opendir returned, never the inode. The library rewrites the
handler table pyfuse3 gives libfuse so that opendir answers ENOSYS in C and readdir is
given the inode as its handle. Operations.opendir returns the inode as the handle too,
so the same readdir serves both ways.

Zero-message open (option filecache): Swift opens an existing file for every GET,
HEAD and DELETE, two round trips each (OPEN, RELEASE). A kernel whose open answered
ENOSYS sends neither again and opens every file with FOPEN_KEEP_CACHE. Reads and
writes through such a file then come with handle 0, and pyfuse3 passes handlers the
handle, not the inode: the library gives them the inode as the handle, marked with
filesystem.INODE_HANDLE (and ROOT_WRITER in a write root sent: pyfuse3 gives `write`
no request context). No OPEN carries O_TRUNC then, so the library takes
ATOMIC_O_TRUNC out of libfuse's INIT answer and the kernel sends it as a SETATTR. Such
a kernel sends no RELEASE for files create() opened either, so packfs gives those a
handle that names the inode too (Filesystem.created_handle; `zero_message_open` tells it).

Listing ends (with dircache): the kernel learns that a listing has ended only from an
empty readdir reply, so every directory listed costs a second READDIRPLUS, half the
requests of a replicator's walk. When packfs's readdir has given the kernel a listing's
last entry it notes the offset it handed out with it (`note_end`), and the library
answers the readdir from that offset itself, empty, without a Python handler.

Xattrs answered in C (option xattrcache): a Swift GET or HEAD reads its file's xattrs
with five getxattr requests (the metadata key, the key after it, the checksum key, each
with a size probe first), ~50 us each through pyfuse3, ~8 us of it packfs's handler.
When packfs has answered one, the library is handed the inode's xattrs
(`cache_xattrs`) and answers the next from them in C, for the last few inodes read.
packfs takes them back (`forget_xattrs`) whenever an inode's xattrs change or the inode
goes, on the event loop's thread, where the library answers too: no request is served
from a stale copy.

Metadata answered in C (option metacache): with the kernel's caches cold, every name a
path walks is a LOOKUP and every directory a replicator lists a READDIRPLUS, each a
round through pyfuse3 to a handler that only reads the inode table. The library answers
LOOKUP (negative entries too), GETATTR and a READDIRPLUS from offset 0 that fits one
reply from the table itself (_shimmeta.c reads it with the GIL pyfuse3's loop holds:
`serve_metadata`), taking the kernel's references as Operations does; anything it cannot
answer exactly reaches the handlers. What it reads is named in tablelayout.py. With
filecache, a READ of a file whose data is one whole record (every Swift object below
disk_chunk_size) is answered too when the record is in the page cache: read with
RWF_NOWAIT and its CRCs checked in C, as Volumes.read does on the loop.

HANDLE_KILLPRIV_V2 (always asked for): the kernel's cached write path (writeback_cache,
or a handle without direct I/O) asks getxattr("security.capability") before every
write() unless the filesystem takes set-ID bits and capabilities itself, which libfuse
3.14 cannot say. The library says it in libfuse's INIT reply, and packfs does it
(Namespace.remove_privileges): a 64 KiB stream then costs one getxattr per file
instead of one per write.

O_TMPFILE (option tmpfile): libfuse 3.14 does not know the kernel's TMPFILE request and
answers it ENOSYS, so open(O_TMPFILE) failed with EOPNOTSUPP, and Swift fell back from
writing each object into a file with no name, linked into place with linkat(2), to a
named temporary file renamed into place. The kernel sends TMPFILE as a CREATE of the
name "/" under another opcode; the library's I/O gives it CREATE's opcode, and packfs's
create makes a file with no name when the name is "/", which no real create can carry.

fallocate (option fallocate): pyfuse3 has no handler for it, so the kernel refused every
fallocate(2) with EOPNOTSUPP (Swift reserves an object's size with one, and punches
holes). The library gives the request to pyfuse3's setxattr handler as the xattr
"packfs.fallocate", its value a random token drawn for the session followed by the mode,
offset and length; packfs serves the setxattr that begins with the token as the
fallocate. No user can send that value: the token never leaves the daemon.

DIRECT_IO_ALLOW_MMAP (always asked for, Linux 6.6 and later): a handle with direct I/O
(direct_writes: the handle that creates a file) cannot be mapped MAP_SHARED (ENODEV)
unless the filesystem says it may, which libfuse 3.14 cannot either. The library says
it in the same INIT reply; the kernel then keeps the mapping coherent with the handle's
direct writes.

FUSE passthrough (option passthrough, Linux 6.9 and later, as root): the kernel then
reads and writes an open file in a backing file of the filesystem's, with no request
per write; libfuse 3.14 knows neither what its INIT reply must carry for that
(FUSE_PASSTHROUGH, max_stack_depth) nor an open reply's backing id. The library's I/O
asks for it when the kernel offers it, and patches the reply to a create packfs staged
(`stage`): it registers the staging file with the kernel and names it in the reply
(staging.py says what packfs does with those files). While a file is open that way the
kernel refuses (EIO) any other open of it but one for passthrough on the same backing
file, which only an OPEN's reply can ask for: the library patches the reply to an open
packfs shares (`share`) the same way. So with passthrough files are not opened without
a request: the library answers the OPEN and RELEASE of every other file in C instead,
as the kernel would have opened it itself (`opens_in_c`).

The library must be in the global symbol scope before pyfuse3 binds libfuse's symbols,
which it does when it is imported (Python loads extensions with RTLD_NOW): importing
this module loads it there, so the daemon imports it before pyfuse3. By itself the
library changes nothing; `enable` asks for each part in the next session. If the
library is not built, or pyfuse3 was bound first, or the kernel is too old, the mount
works as before; the functions below say which way it went.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os

from ..namespace import xattrblob
from .tablelayout import ATIME_RULES, CACHED_XATTRS_MAX


def _load() -> ctypes.PyDLL | None:
    spec = importlib.util.find_spec("packfs.fuse._fuseshim")
    if spec is None or spec.origin is None:
        return None
    # PyDLL: calls keep the GIL. They are short, and a call that let the GIL go could
    # leave the event loop waiting for a worker thread's switch interval (~5 ms). The
    # library's state needs no lock: it is only ever touched on the event loop's thread.
    return ctypes.PyDLL(spec.origin, mode=os.RTLD_NOW | os.RTLD_GLOBAL)


_lib = _load()
if _lib is not None:
    _lib.packfs_shim_note_end.argtypes = [ctypes.c_uint64, ctypes.c_int64]
    _lib.packfs_shim_note_end.restype = None
    _lib.packfs_shim_ends_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_cache_xattrs.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
    _lib.packfs_shim_forget_xattrs.argtypes = [ctypes.c_uint64]
    _lib.packfs_shim_forget_xattrs.restype = None
    _lib.packfs_shim_note_new.argtypes = [ctypes.c_uint64]
    _lib.packfs_shim_note_new.restype = None
    _lib.packfs_shim_xattrs_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_listxattrs_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_tmpfiles.restype = ctypes.c_ulonglong
    _lib.packfs_shim_ioctls_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_stage.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
    _lib.packfs_shim_share.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    _lib.packfs_shim_unshare.argtypes = [ctypes.c_uint64]
    _lib.packfs_shim_unshare.restype = None
    _lib.packfs_shim_opens_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_releases_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_unstage.argtypes = [ctypes.c_uint64]
    _lib.packfs_shim_unstage.restype = None
    _lib.packfs_shim_staged_id.argtypes = [ctypes.c_uint64]
    _lib.packfs_shim_meta_serve.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.py_object, ctypes.py_object,
                                            ctypes.c_double, ctypes.c_double, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    _lib.packfs_shim_meta_prefetched.restype = ctypes.c_ulonglong
    _lib.packfs_shim_meta_xattrs_flat.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
    _lib.packfs_shim_meta_xattrs_flat.restype = ctypes.c_ssize_t
    _lib.packfs_shim_meta_read_flat.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int,
                                                ctypes.c_char_p]
    _lib.packfs_shim_meta_read_flat.restype = ctypes.c_ssize_t
    _lib.packfs_shim_meta_listing.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p,
                                              ctypes.POINTER(ctypes.c_int64)]
    _lib.packfs_shim_meta_listing.restype = ctypes.c_ssize_t
    _lib.packfs_shim_meta_serve.restype = None
    _lib.packfs_shim_meta_answered.argtypes = [ctypes.c_int]
    _lib.packfs_shim_meta_answered.restype = ctypes.c_ulonglong
    _lib.packfs_shim_meta_lookup_flat.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.POINTER(ctypes.c_int64)]
    _lib.packfs_shim_meta_getattr_flat.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64)]

FALLOCATE_TOKEN_SIZE = 16  # _fuseshim.c's TOKEN_SIZE


def enable(dircache: bool, filecache: bool, xattrcache: bool, killpriv: bool = True, tmpfile: bool = True,
           fallocate: bool = True, passthrough: bool = False, metacache: bool = False) -> None:
    """Ask for each part in the next FUSE session (call before pyfuse3.init)."""
    if _lib is not None:
        _lib.packfs_shim_enable(int(dircache), int(filecache), int(xattrcache), int(killpriv), int(tmpfile),
                                int(fallocate), int(passthrough), int(metacache))


def loaded() -> bool:
    """Whether the library is built and loaded (without it, neither part can happen)."""
    return _lib is not None


def installed() -> bool:
    """Whether the last FUSE session made got the rewritten handler table (dircache,
    filecache, xattrcache, fallocate; ioctls are refused and counted with any of them)."""
    return _lib is not None and bool(_lib.packfs_shim_installed())


def zero_message_opendir() -> bool:
    """Whether the last FUSE session opens directories without a request (known once the
    kernel's INIT was answered: the kernel must support it)."""
    return _lib is not None and bool(_lib.packfs_shim_zero_message_opendir())


def zero_message_open() -> bool:
    """Whether the last FUSE session opens files without a request (filecache; known once
    the kernel's INIT was answered)."""
    return _lib is not None and bool(_lib.packfs_shim_zero_message_open())


def opens_in_c() -> bool:
    """Whether the last FUSE session's OPEN and RELEASE requests are answered in C, as the
    kernel would open the file without a request (filecache with passthrough, where the
    kernel must ask: see _fuseshim.c's open_in_c)."""
    return _lib is not None and bool(_lib.packfs_shim_opens_in_c())


def creates_unreleased() -> bool:
    """Whether packfs's handlers are sent no RELEASE for a file create() opened (zero-message
    open, or opens answered in C), unless it was staged."""
    return zero_message_open() or opens_in_c()


def opens_answered() -> int:
    """OPEN requests the library answered (they reach no handler)."""
    return int(_lib.packfs_shim_opens_answered()) if _lib is not None else 0


def releases_answered() -> int:
    """RELEASE requests the library answered (they reach no handler)."""
    return int(_lib.packfs_shim_releases_answered()) if _lib is not None else 0


def killpriv() -> bool:
    """Whether the kernel of the last FUSE session left set-ID bits and file capabilities
    to packfs (HANDLE_KILLPRIV_V2; known once the kernel's INIT was answered)."""
    return _lib is not None and bool(_lib.packfs_shim_killpriv())


def passthrough() -> bool:
    """Whether the kernel of the last FUSE session lets created files be staged
    (FUSE_PASSTHROUGH; known once the kernel's INIT was answered)."""
    return _lib is not None and bool(_lib.packfs_shim_passthrough())


def stage(fh: int, ino: int, fd: int) -> bool:
    """The create of `ino` about to answer with handle `fh` opens staging file `fd` as its
    backing file: the kernel then writes and reads that open file there, with no request.
    False if it cannot be (no passthrough, or too many creates staged at once)."""
    return _lib is not None and bool(_lib.packfs_shim_stage(fh, ino, fd))


def share(ino: int, fh: int) -> bool:
    """The OPEN of the staged file `ino` about to answer with handle `fh` opens it for
    passthrough too, with the same backing file: while a file is open for passthrough the
    kernel refuses (EIO) any other open of it. False if the file is not open for
    passthrough (its open went ahead without a backing file) or too many such replies
    wait to go out."""
    return _lib is not None and bool(_lib.packfs_shim_share(ino, fh))


def unshare(fh: int) -> None:
    """The handle `fh` is released: forget it, if its reply never went out."""
    if _lib is not None:
        _lib.packfs_shim_unshare(fh)


def staged_id(fh: int) -> int:
    """The backing id the staged handle `fh` was opened with; 0 while its create reply has
    not gone out, -errno if the kernel refused the staging file (the open went ahead
    without it)."""
    return _lib.packfs_shim_staged_id(fh) if _lib is not None else 0


def unstage(fh: int) -> None:
    """Forget the staged handle `fh` and give back its backing id, if the kernel gave one."""
    if _lib is not None:
        _lib.packfs_shim_unstage(fh)


def direct_mmap() -> bool:
    """Whether the kernel of the last FUSE session lets a direct I/O handle be mapped
    MAP_SHARED (DIRECT_IO_ALLOW_MMAP; known once the kernel's INIT was answered)."""
    return _lib is not None and bool(_lib.packfs_shim_direct_mmap())


def answers_listing_ends() -> bool:
    """Whether the last FUSE session's readdir goes through the library, which then answers
    the readdir after a listing's noted end (see note_end)."""
    return _lib is not None and bool(_lib.packfs_shim_answers_listing_ends())


def note_end(directory: int, offset: int) -> None:
    """The kernel was given the last entry of a listing of `directory`, with `offset` to
    resume at: the library answers a readdir from there, empty (once)."""
    _lib.packfs_shim_note_end(directory, offset)  # type: ignore[union-attr]


def caches_xattrs() -> bool:
    """Whether the last FUSE session's getxattr goes through the library (xattrcache)."""
    return _lib is not None and bool(_lib.packfs_shim_caches_xattrs())


def cache_xattrs(ino: int, plain: bytes) -> None:
    """Answer getxattr of `ino` from `plain`, its xattrs packed plain (b"": none), until
    forget_xattrs(ino); unless they are past CACHED_XATTRS_MAX: its getxattrs come to
    packfs then."""
    if len(plain) <= CACHED_XATTRS_MAX:
        _lib.packfs_shim_cache_xattrs(ino, plain, len(plain))  # type: ignore[union-attr]


def note_new(ino: int) -> None:
    """packfs just made `ino`, which has no xattrs: the kernel's getxattr of its
    security.capability is answered in C until forget_xattrs(ino)."""
    _lib.packfs_shim_note_new(ino)  # type: ignore[union-attr]


def forget_xattrs(ino: int) -> None:
    """The xattrs of `ino` changed or it went: stop answering from what cache_xattrs gave."""
    _lib.packfs_shim_forget_xattrs(ino)  # type: ignore[union-attr]


def listxattrs_answered() -> int:
    """Listxattr requests the library answered (they reach no handler)."""
    return int(_lib.packfs_shim_listxattrs_answered()) if _lib is not None else 0


def xattrs_answered() -> int:
    """Getxattr requests the library answered (they reach no handler)."""
    return int(_lib.packfs_shim_xattrs_answered()) if _lib is not None else 0


def fallocate_token() -> bytes:
    """The token the last FUSE session's fallocate requests begin with, as the setxattr the
    library makes of them; b"" if they do not come that way (pyfuse3 then answers ENOSYS)."""
    out = ctypes.create_string_buffer(FALLOCATE_TOKEN_SIZE)
    return out.raw if _lib is not None and _lib.packfs_shim_fallocate_token(out) else b""


def serves_tmpfile() -> bool:
    """Whether the last FUSE session hands open(O_TMPFILE) to packfs (option tmpfile)."""
    return _lib is not None and bool(_lib.packfs_shim_serves_tmpfile())


def tmpfiles() -> int:
    """open(O_TMPFILE) requests the library gave to pyfuse3's create handler."""
    return int(_lib.packfs_shim_tmpfiles()) if _lib is not None else 0


def ioctls_answered() -> int:
    """ioctl requests the library refused (ENOTTY; pyfuse3 has none): the kernel sends every
    one, and Python's open() sends one per file."""
    return int(_lib.packfs_shim_ioctls_answered()) if _lib is not None else 0


def ends_answered() -> int:
    """Readdir requests the library answered as a listing's end (they reach no handler)."""
    return int(_lib.packfs_shim_ends_answered()) if _lib is not None else 0


# What metacache answers, by the name `packfs stats` counts it under (_shimmeta.h's enum).
META_OPS = ("lookup", "negative_lookup", "getattr", "listing", "read")
_META_FLAT = 14  # values in a flat answer (_shimmeta.h: META_FLAT)
MetaAnswer = tuple[int, ...]  # ino, mode, nlink, uid, gid, rdev, size, blksize, blocks, atime, mtime, ctime (ns),
# entry and attr timeouts (ms)


def answers_metadata() -> bool:
    """Whether the last FUSE session's lookup and getattr go through the library (metacache)."""
    return _lib is not None and bool(_lib.packfs_shim_answers_metadata())


def serve_metadata(table: object | None, volumes: object | None, entry_timeout: float, attr_timeout: float,
                   getattr_too: bool, atime: str, prefetch: bool = True) -> None:
    """Answer LOOKUP, whole listings (with dircache), GETXATTR (with xattrcache) and, with
    getattr_too, GETATTR and READs of whole records in the page cache (with filecache) from
    this InodeTable and its Volumes (None: stop), with these kernel cache timeouts and
    atime rule (Options.atime), as Operations would, and start a file's read-ahead at its
    first getxattr as Filesystem does with `prefetch`: see _shimmeta.c."""
    if _lib is not None:
        decoder, zdict = xattrblob.swift_form_decoder() or (None, None)
        _lib.packfs_shim_meta_serve(table, volumes, decoder, zdict, entry_timeout, attr_timeout, int(getattr_too),
                                    ATIME_RULES[atime], int(prefetch))


def prefetched() -> int:
    """Records whose read-ahead the library started at a file's first getxattr."""
    return int(_lib.packfs_shim_meta_prefetched()) if _lib is not None else 0


def metadata_answered() -> dict[str, int]:
    """Requests the library answered from the table, by META_OPS name (they reach no handler)."""
    if _lib is None:
        return dict.fromkeys(META_OPS, 0)
    return {op: int(_lib.packfs_shim_meta_answered(i)) for i, op in enumerate(META_OPS)}


def meta_lookup(parent: int, name: bytes) -> tuple[int, MetaAnswer]:
    """What the library answers a LOOKUP with, and does (a reference taken): (0, ()) if it
    leaves it to Python, (1, entry), (2, negative entry)."""
    out = (ctypes.c_int64 * _META_FLAT)()
    r = _lib.packfs_shim_meta_lookup_flat(parent, name, len(name), out)  # type: ignore[union-attr]
    return r, tuple(out) if r else ()


def meta_listing(directory: int, size: int) -> tuple[bytes, int] | None:
    """The reply the library gives a READDIRPLUS of `directory` from offset 0 in `size`
    bytes, and the offset it notes as the listing's end (0: none); each entry takes a
    reference, as then. None if it leaves it to Python."""
    buf, end = ctypes.create_string_buffer(size), ctypes.c_int64()
    used = _lib.packfs_shim_meta_listing(None, directory, size, buf, ctypes.byref(end))  # type: ignore[union-attr]
    return (buf.raw[:used], end.value) if used >= 0 else None


def meta_read(ino: int, size: int, offset: int, noatime: bool = False) -> bytes | None:
    """What the library answers a READ of a file opened without a request with (noatime:
    opened O_NOATIME); None if it leaves it to Python."""
    buf = ctypes.create_string_buffer(size)
    n = _lib.packfs_shim_meta_read_flat(ino, size, offset, int(noatime), buf)  # type: ignore[union-attr]
    return buf.raw[:n] if n >= 0 else None


def meta_xattrs(ino: int) -> bytes | None:
    """The xattrs, packed plain, the library takes from the table at an inode's first
    getxattr; None if it leaves that to Python."""
    room = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(room)
        n = _lib.packfs_shim_meta_xattrs_flat(ino, buf, room)  # type: ignore[union-attr]
        if n <= room:
            return buf.raw[:n] if n >= 0 else None
        room = n


def meta_getattr(ino: int) -> MetaAnswer | None:
    """What the library answers a GETATTR with; None if it leaves it to Python."""
    out = (ctypes.c_int64 * _META_FLAT)()
    return tuple(out) if _lib.packfs_shim_meta_getattr_flat(ino, out) else None  # type: ignore[union-attr]
