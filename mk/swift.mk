# Stock OpenStack Swift on packfs (issue 3). See mount/README.md.
#   make demo               4 packfs devices, rings, Swift on 127.0.0.1, a workload, daemons, summary, teardown;
#                           a passed demo removes what it made in RUN_DIR, a failed one keeps it to be looked at
#   make demo KEEP=1        ... and leave the cluster running (and RUN_DIR); `make stop` tears it down
#   make demo NODE_ROOT=/srv/node    mount the devices at /srv/node/sdb1..sdb4
#   make demo NODES=3       3 storage nodes, each in a network namespace of its own with 2 packfs devices,
#                           rsyncd and servers; a proxy on 127.0.0.1; a node fails under PUTs and returns
#                           (rsync, then ssync), a disk is replaced; summary, teardown (mount/multinode_demo.py)
#   make swift-test         the tests/swift suite (stock Swift on real packfs mounts)
#   make swift-unit         Swift's own unit tests (diskfile, utils, libc) with TMPDIR on packfs
#   make swift-unit-xfs     the same on a loop-mounted XFS image: the baseline (935 passed + 9 skipped)
# Knobs: RUN_DIR (default run/demo), NODES, NODE_ROOT, KEEP, SWIFT_BACKEND=dir (plain directories,
#        no packfs), PACKFS_OPTIONS (packfs -o options for every device).
.PHONY: demo stop swift-test swift-unit swift-unit-xfs

RUN_DIR       ?= run/demo
NODES         ?=
NODE_ROOT     ?=
KEEP          ?=
SWIFT_BACKEND ?=
PACKFS_OPTIONS ?=

DEMO_ARGS = --run-dir $(RUN_DIR) $(if $(NODES),--nodes $(NODES)) $(if $(NODE_ROOT),--node-root $(NODE_ROOT)) \
            $(if $(SWIFT_BACKEND),--backend $(SWIFT_BACKEND)) \
            $(if $(PACKFS_OPTIONS),--mount-options $(PACKFS_OPTIONS)) $(if $(KEEP),--keep)

demo: setup
	$(PY) mount/demo.py $(DEMO_ARGS)

stop:
	$(PY) mount/demo.py --stop --run-dir $(RUN_DIR)

swift-test: setup
	$(PY) -m pytest -q -ra -m swift tests/swift $(PYTEST_ARGS)

swift-unit: setup
	$(PY) mount/swift_unit.py --fs packfs --check $(if $(PACKFS_OPTIONS),--options $(PACKFS_OPTIONS))

swift-unit-xfs: setup
	$(PY) mount/swift_unit.py --fs xfs
