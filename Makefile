# packfs: every target installs what it needs on a fresh Debian machine.
SHELL      := /bin/bash
PYTHON     ?= python3
VENV       ?= .venv
PY         := $(VENV)/bin/python
STAMPS     := .stamps
APT_PKGS   := fuse3 libfuse3-dev fio xfsprogs liberasurecode-dev memcached \
              pkg-config gcc python3-dev python3-venv rsync iproute2
PYTEST_ARGS ?=

.PHONY: setup test unit clean

setup: $(STAMPS)/venv

# Debian packages: apt-get update once, and only when something is missing.
$(STAMPS)/apt:
	@mkdir -p $(STAMPS)
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi
	@touch $@

$(STAMPS)/venv: $(STAMPS)/apt pyproject.toml setup.py $(wildcard packfs/*/_*.c packfs/*/_*.h)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,swift,bench]'
	@touch $@

unit: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# The fs tests of metadata, xattrs and reads again with metacache off: each answer the fuse
# shim gives from the inode table must be the one packfs's handlers give (both ways pass).
NOMETACACHE_TESTS := $(addprefix tests/fs/test_,readwrite.py dirs.py links.py rename.py attrs.py xattrcache.py \
                       lookup_counts.py random_ops.py atime.py sparse.py prefetch.py swift_surface.py \
                       fallocate.py corruption.py)

test: setup
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)
	PACKFS_TEST_OPTIONS=nometacache $(PY) -m pytest -q -ra $(NOMETACACHE_TESTS)

# run/ holds the demo's and the benchmarks' packs: refuse while anything is mounted under it
# (a cluster kept with KEEP=1: `make stop` first), and never cross into a mount.
clean:
	@if grep -q " $(CURDIR)/run/" /proc/mounts; then \
	  echo "make clean: something is mounted under $(CURDIR)/run (make stop, or unmount it) first" >&2; exit 1; \
	fi
	rm -rf --one-file-system $(STAMPS) build *.egg-info run
	find packfs -name '*.so' -delete

# Feature targets live in mk/: demo and Swift (mk/swift.mk), benchmarks (mk/bench.mk), crash campaign.
include $(wildcard mk/*.mk)
