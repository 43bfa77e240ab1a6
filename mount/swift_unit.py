#!/usr/bin/env python3
"""Run stock Swift's own unit tests with TMPDIR on a packfs mount (make swift-unit).

    swift_unit.py [--fs packfs|xfs|dir] [--run-dir run/swift-unit] [--json OUT]

The swift sdist on PyPI ships its unit tests. This downloads it once (``pip
download --no-deps --no-binary :all: swift==2.38.*`` into ``<run>/cache``),
unpacks it, installs the few test requirements these files need
(pytest-subtests) into the running venv, and runs

    test/unit/obj/test_diskfile.py
    test/unit/common/test_utils.py
    test/unit/common/utils/test_libc.py

with TMPDIR inside the filesystem under test:

* ``packfs``: a fresh packfs (``<run>/pack`` mounted at ``<run>/mnt``);
* ``xfs``: the baseline, a loop-mounted XFS image (``<run>/xfs.img``), removed afterwards;
* ``dir``: a plain directory on whatever ``<run>`` is on.

The sdist is unpacked in ``<run>/cache``; nothing is written into it (no
pytest cache), the tests' own files all go to TMPDIR.

Prints and (with --json) writes the pytest outcome counts and the failing
test ids. Every mount it makes is unmounted, also on failure.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swiftcluster import REPO, mounts  # noqa: E402

SWIFT_SPEC = "swift==2.38.*"
TEST_FILES = ["test/unit/obj/test_diskfile.py", "test/unit/common/test_utils.py",
              "test/unit/common/utils/test_libc.py"]
XFS_BASELINE = {"passed": 935, "skipped": 9, "total": 944}
# Skips that XFS has too (not filesystem-related): splice zero-copy, pkg_resources.
XFS_SKIP_REASONS = ("zero-copy support is missing", "pkg_resources loading")

# packfs must pass every test XFS passes (until 9a1b9ca, 2026-11-27, 12 could not: O_TMPFILE and
# fallocate, which the fuse shim now hands to packfs; docs/swift-unit-tests.md).
REQUIRED_PASSED = XFS_BASELINE["passed"]


def sdist(cache: Path, python: str) -> Path:
    """The unpacked sdist tree (downloaded and unpacked once, in ``cache``)."""
    cache.mkdir(parents=True, exist_ok=True)
    tars = sorted(glob.glob(str(cache / "swift-2.38.*.tar.gz")))
    if not tars:
        subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        SWIFT_SPEC, "-d", str(cache)], check=True)
        tars = sorted(glob.glob(str(cache / "swift-2.38.*.tar.gz")))
    tar = Path(tars[-1])
    src = cache / tar.name[: -len(".tar.gz")]
    if not (src / "test" / "unit").is_dir():
        with tarfile.open(tar) as t:
            t.extractall(cache, filter="data")
    return src


def ensure_requirements(python: str) -> None:
    r = subprocess.run([python, "-c", "import pytest_subtests, swift"], capture_output=True)
    if r.returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "pytest-subtests"], check=True)


@contextlib.contextmanager
def xfs_mount(run_dir: Path, size: str = "2G"):
    img, mnt = run_dir / "xfs.img", run_dir / "xfs-mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    if mounts.is_mounted(mnt):
        subprocess.run(["umount", str(mnt)], check=True)
    img.unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", size, str(img)], check=True)
    subprocess.run(["mkfs.xfs", "-q", "-f", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)]).returncode:
            subprocess.run(["umount", "-l", str(mnt)])
        img.unlink(missing_ok=True)


@contextlib.contextmanager
def packfs_mount(run_dir: Path, options: str = ""):
    packdir, mnt = run_dir / "pack", run_dir / "mnt"
    shutil.rmtree(packdir, ignore_errors=True)
    with mounts.mounted(packdir, mnt, options) as m:
        yield m


@contextlib.contextmanager
def plain_dir(run_dir: Path):
    d = run_dir / "plain"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    yield d


def parse_junit(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed: list[str] = []
    not_passed: dict[str, str] = {}   # test id -> outcome: message
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        for kind, key in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            if kind in kinds:
                counts[key] += 1
                not_passed[tid] = f"{key}: {kinds[kind].get('message', '')[:300]}"
                if key != "skipped":
                    failed.append(tid)
                break
        else:
            counts["passed"] += 1
    counts["total"] = sum(counts.values())
    return {**counts, "failed_ids": failed, "not_passed": not_passed}


def unexpected(result: dict) -> dict[str, str]:
    """Tests that did not pass and are not skipped on XFS too."""
    return {tid: why for tid, why in result["not_passed"].items()
            if not (why.startswith("skipped") and any(r in why for r in XFS_SKIP_REASONS))}


def check(result: dict) -> list[str]:
    """What is wrong with a packfs result, compared with XFS (empty: as good as XFS allows)."""
    problems = [f"{tid}: {why}" for tid, why in unexpected(result).items()]
    if result["passed"] < REQUIRED_PASSED:
        problems.append(f"{result['passed']} passed < {REQUIRED_PASSED}, as on XFS")
    return problems


def run(fs: str, run_dir: Path, python: str = sys.executable, options: str = "",
        extra: list[str] | None = None, timeout: float = 1800, cache: Path | None = None) -> dict:
    """Run the unit tests with TMPDIR on ``fs``; the sdist is cached in ``cache``
    (default ``<run_dir>/cache``)."""
    run_dir = run_dir.absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    src = sdist((cache or run_dir / "cache").absolute(), python)
    ensure_requirements(python)
    where = {"packfs": lambda: packfs_mount(run_dir, options), "xfs": lambda: xfs_mount(run_dir),
             "dir": lambda: plain_dir(run_dir)}[fs]
    junit = run_dir / f"results-{fs}.xml"
    junit.unlink(missing_ok=True)
    with where() as mnt:
        tmp = Path(mnt) / "tmp"
        tmp.mkdir(exist_ok=True)
        env = dict(os.environ, TMPDIR=str(tmp))
        t0 = time.monotonic()
        # -p no:cacheprovider: nothing written into the sdist tree; override the
        # project's own pytest options (timeout, testpaths) with the sdist's rootdir.
        r = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                            "--rootdir", str(src), f"--junitxml={junit}", "-rfEs", *TEST_FILES, *(extra or [])],
                           cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
        elapsed = time.monotonic() - t0
    (run_dir / f"pytest-{fs}.log").write_text(r.stdout + r.stderr)
    if not junit.exists():
        raise RuntimeError(f"pytest wrote no results (rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    result = parse_junit(junit)
    result.update(fs=fs, seconds=round(elapsed, 1), pytest_rc=r.returncode,
                  summary=(r.stdout.strip().splitlines() or [""])[-1], log=str(run_dir / f"pytest-{fs}.log"))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fs", default="packfs", choices=["packfs", "xfs", "dir"])
    ap.add_argument("--run-dir", default=str(REPO / "run" / "swift-unit"))
    ap.add_argument("--options", default=os.environ.get("PACKFS_OPTIONS", ""), help="packfs -o options")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every test that passes on XFS passes here (docs/swift-unit-tests.md)")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    result = run(args.fs, Path(args.run_dir), options=args.options, extra=args.pytest_args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"swift unit tests on {args.fs}: {result['passed']} passed, {result['skipped']} skipped, "
          f"{result['failed']} failed, {result['errors']} errors of {result['total']} "
          f"in {result['seconds']}s (XFS baseline: {XFS_BASELINE['passed']} passed + "
          f"{XFS_BASELINE['skipped']} skipped of {XFS_BASELINE['total']})")
    for tid in result["failed_ids"]:
        print("  FAILED", tid)
    print(f"  full log: {result['log']}")
    if args.check and args.fs == "packfs":
        problems = check(result)
        for p in problems:
            print("  UNEXPECTED", p)
        print("check:", "FAILED" if problems else f"OK (>= {REQUIRED_PASSED} passed, as on XFS; nothing else differs)")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
