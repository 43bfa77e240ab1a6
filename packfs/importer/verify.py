"""The check at the end of an import: the pack reopened as a mount would open it (the
catalog loaded, the log replayed) holds what the import made."""
from __future__ import annotations

import itertools
import stat

from ..core.pack import Pack
from .tally import Tally


def differences(p: Pack, made: Tally) -> list[str]:
    """What the reopened pack holds otherwise than the tally of what was made; [] if nothing.
    Counts by whole columns, a few seconds at millions of inodes: every inode by type,
    sizes, the bytes the records hold, names and inodes with xattrs (in memory, in their
    records or in the catalog alone, as p's xattrs_in_memory leaves them)."""
    t = p.ns.table
    dirs, others, size = t.usage()
    regular, symlinks = t.of_type(stat.S_IFREG).count(1), t.of_type(stat.S_IFLNK).count(1)
    names = sum(map(t.nlink_of, itertools.compress(itertools.count(), t.not_dirs())))
    held = {
        "directories": (dirs, made.directories),
        "regular files": (regular, made.files),
        "symlinks": (symlinks, made.symlinks),
        "device nodes, FIFOs and sockets": (others - regular - symlinks, made.specials),
        "names of files": (names, made.files + made.links + made.symlinks + made.specials),
        "bytes in files and symlink targets": (size, made.bytes + made.target_bytes),
        "bytes of data in records": (sum(t.record_lengths()) + sum(t.mapped_record_lengths()), made.data_bytes),
        "inodes with xattrs": (t.xattrs_in_memory() + t.xattrs_in_records() + t.xattrs_in_catalog(),
                               made.with_xattrs),
    }
    return [f"{what}: {found:,}, {wanted:,} imported" for what, (found, wanted) in held.items() if found != wanted]
