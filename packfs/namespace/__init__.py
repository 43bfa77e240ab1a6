"""The in-memory inode table: inodes, directory entries, xattrs and their packed forms.

Lookups, listings and getattr are answered from here without disk IO. It knows where a
file's bytes are (extent maps, packfs.store.extents) but never reads or writes them: it
may import the store's plain data modules, packfs.swiftmeta and packfs's shared modules,
never packfs.core or anything above.
"""
