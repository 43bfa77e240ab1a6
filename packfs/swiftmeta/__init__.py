"""Swift's object metadata (a pickled dict) read and made again byte for byte, in Python
and in C: the codec behind the compact Swift form of xattrs (packfs.namespace.xattrblob).

It imports nothing of packfs.
"""
