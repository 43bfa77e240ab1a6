"""The FUSE adapter: the daemon, pyfuse3's Operations and the fuse shim (C) beside them.

It turns kernel requests into calls on the core (packfs.core.filesystem) and owns what only
a mount has: the request loop, busy polling, the control socket, passthrough staging.
It is the only layer that imports pyfuse3. It may import every layer below it: core,
namespace, store, and packfs's shared modules (errors, options, stats).
"""
