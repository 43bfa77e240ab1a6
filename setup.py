"""Builds packfs's three C parts: _fuseshim.c, what packfs asks of libfuse beyond pyfuse3
(packfs/fuse/fuseshim.py; with _shimmeta.c, its LOOKUP, GETATTR, listings and warm READs answered from the inode
table),
_logwriter.c, the volume log's writer thread (packfs/store/logwriter.py), and _swiftform.c, Swift's
metadata made again from the form xattrblob.py stores it in.

Everything else about the package is in pyproject.toml."""
import subprocess

from setuptools import Extension, setup


def _fuse3_include_dirs() -> list[str]:
    try:
        flags = subprocess.run(["pkg-config", "--cflags-only-I", "fuse3"], capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return ["/usr/include/fuse3"]
    return [f[2:] for f in flags if f.startswith("-I")]


setup(ext_modules=[Extension("packfs.fuse._fuseshim", ["packfs/fuse/_fuseshim.c", "packfs/fuse/_shimmeta.c"],
                             depends=["packfs/fuse/_shimmeta.h", "packfs/fuse/_tablelayout.h"],
                             include_dirs=_fuse3_include_dirs(),
                             libraries=["fuse3", "dl", "z"], extra_compile_args=["-O2", "-Wall", "-Werror"],
                             optional=True),
                   Extension("packfs.store._logwriter", ["packfs/store/_logwriter.c"],
                             extra_compile_args=["-O2", "-Wall", "-Werror"], optional=True),
                   Extension("packfs.swiftmeta._swiftform", ["packfs/swiftmeta/_swiftform.c"], libraries=["z", "m"],
                             extra_compile_args=["-O2", "-Wall", "-Werror"], optional=True)])
