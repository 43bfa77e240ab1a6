"""packfs: a FUSE filesystem that packs file contents into append-only volumes.

Layers, top to bottom (imports only point down):
  ops (pyfuse3 adapter) -> filesystem (core facade) -> namespace, writeback, journal
  -> volumes, catalog -> records, disk.
"""

__version__ = "0.1.0"
FORMAT_VERSION = 5  # 2: xattrs may be stored compressed (xattrblob); 3: with a second dictionary; 4: in the Swift form;
# 5: a META row may log a long extent map as its edits
READABLE_FORMATS = (1, 2, 3, 4, 5)  # an older pack is upgraded in place when it is mounted
