"""The inode table as the fuse shim's C reads it (_shimmeta.c): the namespace's constants
and the attribute names C looks up, written to _tablelayout.h from the namespace's own
values, so that C and Python cannot drift apart silently. tests/unit/test_shimmeta.py
fails when the header is not what `python -m packfs.fuse.tablelayout` writes, and when a
named attribute is missing from an InodeTable or not of the type C reads.

What C reads, all on the event loop's thread while it holds the GIL (pyfuse3 calls the
handlers from fuse_session_process_buf with it held): the columns as buffers (array,
bytearray), taken anew for each request, so a column the table grew or replaced is the
one C reads; the few dicts (big directories, wide values, device numbers, unflushed
runs, extent maps) with the C API; for a READ of a whole record, the Volumes' open files,
queued records and pack id, and the record header's layout. No Python code runs: every attribute named here is
a plain instance attribute or a slot, never a property.
"""
from __future__ import annotations

import re
import stat
import struct
import sys
from pathlib import Path

from ..core.filesystem import RELATIME_NS
from ..namespace import dirents, inodes, offsettimes, xattrblob, xattrstore
from ..store import extents, records, volumes

# records.HEADER's fields, in order (see records.py)
_HEADER_FIELDS = ("magic", "type", "flags", "reserved", "seq", "ino", "offset", "length", "payload_crc", "pack_id")


def _header_offset(field: str) -> int:
    codes = re.findall(r"\d*[a-zA-Z]", records.HEADER.format.lstrip("<"))
    assert len(codes) == len(_HEADER_FIELDS)
    return struct.calcsize("<" + "".join(codes[:_HEADER_FIELDS.index(field)]))


# The shim keeps one inode's xattrs per slot of 256 (fuseshim.cache_xattrs): up to this many
# bytes each (Swift's are ~500 B). One inode may hold 16 MiB of them, which every getxattr would copy.
CACHED_XATTRS_MAX = 64 << 10
BLKSIZE = 65536  # st_blksize of every inode (Operations.attrs)
# pyfuse3's EntryAttributes defaults, which a negative entry (Operations.lookup) keeps
ENTRY_DEFAULTS = {"TL_ENTRY_DEFAULT_ATTR_TIMEOUT": 300, "TL_ENTRY_DEFAULT_MODE": stat.S_IFREG,
                  "TL_ENTRY_DEFAULT_BLKSIZE": 4096, "TL_ENTRY_DEFAULT_NLINK": 1}

# What a listing does to its directory's atime (Options.atime, Filesystem.accessed), by number
ATIME_RULES = {"noatime": 0, "relatime": 1, "strictatime": 2}

CONSTANTS: dict[str, int] = {
    "TL_SMALL": inodes.SMALL,
    "TL_NLINK_TOP": inodes.NLINK_TOP,
    "TL_SIZE_TOP": inodes.NARROW_TOPS["size"],
    "TL_FAR": offsettimes.FAR,
    "TL_SEP": dirents.SEP[0],
    "TL_HEX_MARK": dirents._HEX_MARK[0],
    "TL_STAMP_MARK": dirents._STAMP_MARK[0],
    "TL_STAMP_BYTES": dirents._STAMP.size - 1,
    "TL_EXTENT_SIZE": extents.PACKED.size,
    "TL_EXTENT_LEN_AT": struct.calcsize(extents.PACKED.format[:2]),
    "TL_BLKSIZE": BLKSIZE,
    **ENTRY_DEFAULTS,
    "TL_ATIME_NEVER": ATIME_RULES["noatime"],
    "TL_ATIME_RELATIVE": ATIME_RULES["relatime"],
    "TL_RELATIME_NS": RELATIME_NS,
    "TL_REC_PAGE_BITS": inodes._REC_PAGE_BITS,
    "TL_REC_PAGE_SHIFT": 12,  # a `rec` counts 4 KiB pages (InodeTable.extent_list)
    "TL_READ_MAX": volumes.INLINE_READ_MAX,
    "TL_RECORD_HEADER_SIZE": records.HEADER_SIZE,
    "TL_RECORD_DATA": records.DATA,
    **{f"TL_RECORD_{field.upper()}_AT": _header_offset(field) for field in ("type", "flags", "reserved", "ino",
                                                                             "length", "payload_crc", "pack_id")},
    "TL_RECORD_HEADER_CRC_AT": records.HEADER.size,
    "TL_RECORD_XATTRS": records.XATTRS,
    "TL_RECORD_BLOCK": records.BLOCK,
    "TL_IN_CATALOG": xattrstore.IN_CATALOG,
    "TL_IN_RECORD": xattrstore.IN_RECORD,
    "TL_CACHED_XATTRS_MAX": CACHED_XATTRS_MAX,
}
RECORD_MAGIC = records.MAGIC
STAMP_EXTS = dirents._STAMP_EXTS

# Attribute names, by what C holds them as: columns (buffers), dicts, and the rest.
COLUMNS = {"TL_KIND": "kind", "TL_SIZE": "size", "TL_MTIME": "mtime", "TL_KID": "kid", "TL_KNAME": "kname",
           "TL_LOOKUPS": "lookups", "TL_VOLUMES": "volumes"}
DICTS = {"TL_DIRS": "dirs", "TL_RDEV": "rdev", "TL_WIDE_NLINK": "wide_nlink", "TL_WIDE_SIZE": "wide_size",
         "TL_WBUF": "wbuf", "TL_EXTENTS": "extents", "TL_DIR_XAT": "dir_xat", "TL_XATTR_PLAIN": "_plain"}
OTHERS = {"TL_KINDS": "kinds", "TL_NAMES": "names", "TL_ATIMES": "atimes", "TL_CTIMES": "ctimes",
          "TL_ARENA_DATA": "data", "TL_ARENA_GRAIN": "grain", "TL_TIMES_COLUMN": "column", "TL_TIMES_FAR": "far",
          "TL_PACKED_NAMES": "names", "TL_PACKED_INOS": "inos", "TL_PACKED_WIDTH": "width", "TL_RUN_SIZE": "size",
          "TL_XATTR_ARENA": "xblobs", "TL_XATTR_COMPACTING": "_xnew"}
# ... and of the Volumes (store/volumes.py), for reads of whole records
STORE = {"TL_STORE_FDS": "fds", "TL_STORE_INFLIGHT": "_inflight", "TL_STORE_PACK_ID": "pack_id"}

HEADER = Path(__file__).with_name("_tablelayout.h")


def _c_bytes(b: bytes) -> str:
    return "".join(f"\\x{c:02x}" for c in b)


def header() -> str:
    """The text of _tablelayout.h."""
    lines = ["/* Generated by `python -m packfs.fuse.tablelayout` from the namespace's constants: do not edit. */",
             "#ifndef PACKFS_TABLELAYOUT_H", "#define PACKFS_TABLELAYOUT_H"]
    lines += [f"#define {k} {v}ULL" for k, v in CONSTANTS.items()]
    exts = ", ".join('"' + e.decode() + '"' for e in STAMP_EXTS)
    lines += [f"#define TL_STAMP_EXTS {{{exts}}}", f"#define TL_STAMP_EXT_COUNT {len(STAMP_EXTS)}",
              f'#define TL_RECORD_MAGIC "{RECORD_MAGIC.decode()}"',
              f'#define TL_XATTR_PREFIXES "{_c_bytes(b"".join(xattrblob.COMPRESSED_PREFIXES))}"',
              f'#define TL_XATTR_SWIFT_PREFIX "{_c_bytes(xattrblob.SWIFT_FORM_PREFIX)}"']
    lines += [f'#define {k}_ATTR "{v}"' for group in (COLUMNS, DICTS, OTHERS, STORE) for k, v in group.items()]
    lines += ["#endif", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    HEADER.write_text(header())
    sys.stdout.write(f"wrote {HEADER}\n")
