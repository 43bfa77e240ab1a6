"""packfs: a FUSE filesystem that packs file contents into append-only volumes.

Layers, top to bottom (imports only point down):
  ops (pyfuse3 adapter) -> filesystem (core facade) -> namespace, writeback, journal
  -> volumes, catalog -> records, disk.
"""

__version__ = "0.1.0"
FORMAT_VERSION = 2  # 2: xattrs may be stored compressed (inodes.pack_xattrs)
READABLE_FORMATS = (1, 2)  # a format-1 pack is upgraded in place when it is mounted
