"""packfs: a FUSE filesystem that packs file contents into append-only volumes.

Layers, top to bottom; imports only point down (tests/unit/test_layers.py checks it):

  cli.py                  the command line
  fuse/  fsck/  importer/ the FUSE adapter (the only user of pyfuse3); the offline checker;
                          a pack built from a directory tree (packfs import)
  core/                   Filesystem, write-behind, journal, catalog, recovery, opening a pack
  namespace/              the in-memory inode table
  store/     swiftmeta/   volumes of records and their writer; Swift's metadata codec
  store/disk.py           the only module that does OS IO on the pack
  errors.py, options.py, stats.py, progress.py: plain values any layer may use;
  prometheus.py: the stats as Prometheus text (a pure function, for the cli)
"""

__version__ = "0.1.0"
FORMAT_VERSION = 6  # 2: xattrs may be stored compressed (xattrblob); 3: with a second dictionary; 4: in the Swift form;
# 5: a META row may log a long extent map as its edits; 6: a DATA record may carry its file's xattrs
READABLE_FORMATS = (1, 2, 3, 4, 5, 6)  # an older pack is upgraded in place when it is mounted
