"""The shape of one inode's snapshot, as the journal and the catalog store it.

A module of its own so that the inode table (inodes.py) and its xattr part
(xattrstore.py), which both read rows, need not import each other.
"""

# (ino, mode, uid, gid, nlink, size, atime, mtime, ctime, rdev, target, xattrs, extents, parent)
# with xattrs and extents in their packed forms (see xattrblob.pack_xattrs and extents.pack). In a
# journal row a long map may instead be a list: its edits since the previous row (extents.pack_edits).
InodeRow = tuple
