"""The filesystem without FUSE: one Filesystem over an open pack.

Filesystem (the facade the adapter calls), the write-behind buffers, the journal's
group commit, the SQLite catalog's checkpoints, recovery at mount and the opening of a
pack. It ties the in-memory namespace to the store below it, and may import namespace,
store and packfs's shared modules, never packfs.fuse or pyfuse3.
"""
