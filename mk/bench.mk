# Benchmarks (issue 5): packfs side by side with XFS and ext4.  See bench/__main__.py.
#   make bench          every part, one table (bench-results/bench.md, .json, .png)
#   make bench-fio      fio-jobs/ only
#   make bench-swift    stock Swift object server workloads only
#   make bench-scale    lots of small files (seed 004): walk, cold GETs, RSS, mount, recovery
#   make bench-swift-large   only Swift's 1 GiB PUTs and GET (compare BENCH_PACKFS_OPTS for large objects)
#   QUICK=1             small sizes, under 10 minutes in all
#   BENCH_DISK=hdd      the disk modelled as one 7200 rpm drive (bench/diskmodel.py); results in bench-results/hdd
# Knobs: BENCH_REPS, BENCH_WORK, BENCH_OUT, BENCH_FS, BENCH_OBJECTS, BENCH_PACKFS_OPTS,
#        BENCH_PACKFS_BACKING, BENCH_HALT_POLL_NS, BENCH_DISK, BENCH_HDD_IOPS, BENCH_HDD_MBPS,
#        BENCH_HDD_SEEK_MS, BENCH_HDD_WRITE_CACHE, BENCH_CGROUP_MEM, BENCH_CGROUP_BASE, BENCH_PACED_SECONDS (exported to the
#        harness from the environment or make's command line; bench/README.md).
.PHONY: bench bench-fio bench-swift bench-swift-large bench-scale bench-report

BENCH_RUN = QUICK=$(QUICK) $(PY) -m bench

bench: setup
	$(BENCH_RUN) all

bench-fio: setup
	$(BENCH_RUN) fio

bench-swift: setup
	$(BENCH_RUN) swift

bench-swift-large: setup
	$(BENCH_RUN) swift-large

bench-scale: setup
	$(BENCH_RUN) scale

bench-report: setup
	$(PY) -m bench report
