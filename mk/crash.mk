# Crash consistency (issue 4). See docs/crash-safety.md and tests/crash/campaign.py.
#   make crash-campaign SEEDS=N     a long power-cut campaign over N seeds; a line per seed as it ends, then a summary:
#                                   crash points, operations, violations (exit 1 on any violation)
#       CRASH_OPS=300               operations per seed
#       CRASH_JOBS=$(nproc)         seeds run in parallel
#       CRASH_FIRST_SEED=1          first seed (seeds are consecutive)
#   make recovery-scale             recovery time after an unclean stop with RECOVERY_FILES files
#       RECOVERY_FILES=1000000      (builds the pack under run/recovery-scale; minutes; run it on a quiet machine)
#       RECOVERY_ARGS=--cold        extra arguments, e.g. drop the page cache before measuring
#   make crash-test                 the bounded crash, fsck and I/O-error tests CI runs (tests/crash)
.PHONY: crash-campaign recovery-scale crash-test

SEEDS            ?= 20
CRASH_OPS        ?= 300
CRASH_JOBS       ?= $(shell nproc 2>/dev/null || echo 1)
CRASH_FIRST_SEED ?= 1
RECOVERY_FILES   ?= 1000000
RECOVERY_ARGS    ?=

crash-campaign: setup
	$(PY) tests/crash/campaign.py --seeds $(SEEDS) --first-seed $(CRASH_FIRST_SEED) --ops $(CRASH_OPS) --jobs $(CRASH_JOBS)

recovery-scale: setup
	$(PY) tests/crash/recovery_scale.py --files $(RECOVERY_FILES) $(RECOVERY_ARGS)

crash-test: setup
	$(PY) -m pytest -q -ra tests/crash $(PYTEST_ARGS)
