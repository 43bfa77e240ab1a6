"""Stock Swift's own unit tests (DiskFile, utils, libc) with TMPDIR on a packfs mount.

Same runner as `make swift-unit` (mount/swift_unit.py). On XFS these give 935 passed +
9 skipped of 944. On packfs every test that passes on XFS must pass, O_TMPFILE's and
fallocate's among them (the fuse shim hands both to packfs; docs/swift-unit-tests.md),
and nothing else may differ.
"""
from __future__ import annotations

from swiftenv import REPO, require_packfs

import swift_unit  # mount/swift_unit.py (swiftenv puts mount/ on sys.path)


def test_swift_unit_tests_on_packfs(tmp_path):
    require_packfs()
    result = swift_unit.run("packfs", tmp_path / "swift-unit", cache=REPO / "run" / "swift-unit" / "cache")
    print(f"swift unit tests on packfs: {result['passed']} passed, {result['skipped']} skipped, "
          f"{result['failed']} failed, {result['errors']} errors of {result['total']} in {result['seconds']}s")
    assert result["total"] == swift_unit.XFS_BASELINE["total"], result["summary"]
    problems = swift_unit.check(result)
    assert not problems, "\n".join(problems) + f"\nlog: {result['log']}"
    assert result["passed"] >= swift_unit.REQUIRED_PASSED
