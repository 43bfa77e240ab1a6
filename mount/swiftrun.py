#!/usr/bin/env python3
"""Run one of stock Swift's console scripts with a run-directory swift.conf.

    swiftrun.py SCRIPT [ARGS...]      e.g. swiftrun.py swift-object-server object-server.conf -v

Stock Swift reads its cluster-wide settings (hash prefix/suffix, storage
policies, constraints) from the hard-coded path /etc/swift/swift.conf. Every
other file (server configs, rings via ``swift_dir``) is passed explicitly. To
keep a demo or test cluster entirely inside its run directory, this wrapper
points that one constant at ``$PACKFS_SWIFT_CONF`` before Swift's modules read
it, then calls the console script's entry point exactly as the installed
``bin/`` wrapper would. No Swift code is changed.
"""
from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    name = sys.argv[1]
    conf = os.environ.get("PACKFS_SWIFT_CONF")
    if conf:
        import swift.common.utils as utils
        utils.SWIFT_CONF_FILE = conf
    eps = entry_points(group="console_scripts", name=name)
    if not eps:
        sys.exit(f"swiftrun: no console script named {name!r}")
    func = next(iter(eps)).load()
    sys.argv[:] = [name, *sys.argv[2:]]  # in place: some scripts bind sys.argv at import
    sys.exit(func())


if __name__ == "__main__":
    main()
