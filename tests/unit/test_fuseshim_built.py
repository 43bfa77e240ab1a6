"""The fuse shim is built with the package: its C parts are optional to the build (a
mount works without them), so a compile error would otherwise only show as skipped
tests and a slower mount."""
from __future__ import annotations

from packfs.fuse import fuseshim


def test_the_fuse_shim_is_built_with_its_table_reader():
    assert fuseshim.loaded(), "packfs/fuse/_fuseshim.c (with _shimmeta.c) is not built: see `make setup`'s output"
    assert hasattr(fuseshim._lib, "packfs_shim_meta_serve"), "the fuse shim was built without _shimmeta.c"
