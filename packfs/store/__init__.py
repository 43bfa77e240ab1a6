"""The bytes on the backing filesystem: volumes of checksummed records and their writer.

disk.py is the only module that does OS IO on the pack (so tests can put a faulty disk
in its place) and imports nothing of packfs. The rest may import disk.py and packfs's
shared modules, never the namespace or anything above.
"""
