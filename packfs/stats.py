"""Per-operation counts and latency histograms, cheap enough for every FUSE request."""
from __future__ import annotations

import errno
import math

# FUSE requests the fuse shim answers in C (packfs/fuse/_fuseshim.c), which no handler sees and
# so OpStats does not count: by request, the `packfs stats` key that counts them.
ANSWERED_IN_SHIM = (("readdir", "listing_ends_answered_in_shim"), ("getxattr", "xattrs_answered_in_shim"),
                    ("ioctl", "ioctls_answered_in_shim"), ("open", "opens_answered_in_shim"),
                    ("release", "releases_answered_in_shim"), ("lookup", "lookups_answered_in_shim"),
                    ("lookup", "negative_lookups_answered_in_shim"), ("getattr", "getattrs_answered_in_shim"),
                    ("readdir", "listings_answered_in_shim"), ("read", "reads_answered_in_shim"),
                    ("listxattr", "listxattrs_answered_in_shim"))

# The answers that say packfs does not do what was asked, by design (POSIX ACLs and other
# xattr namespaces but user., trusted. and security.; fallocate's collapse, insert and
# unshare): `refused` in `packfs stats`, not `errors`.
REFUSALS = frozenset({errno.EOPNOTSUPP})

# Buckets are quarter powers of two of nanoseconds: about 19% wide, 0 ns to ~70 s.
_BUCKETS = 4 * 36


class OpStats:
    """Per operation: requests, those that failed (`errors`), those refused by design
    (`refused`: what packfs does not do, as POSIX ACLs, answered EOPNOTSUPP; `cp -a` asks
    for them on every file, and counted as errors they alarmed operators), and latency."""

    __slots__ = ("counts", "errors", "refused", "hist", "total_ns")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.hist: dict[str, list[int]] = {}
        self.total_ns: dict[str, int] = {}

    def record(self, op: str, ns: int, failed: bool = False, refused: bool = False) -> None:
        """One request that took `ns`; `refused` ones are not counted as `failed` too."""
        h = self.hist.get(op)
        if h is None:
            h = self.hist[op] = [0] * _BUCKETS
            self.counts[op] = self.errors[op] = self.refused[op] = self.total_ns[op] = 0
        self.counts[op] += 1
        self.total_ns[op] += ns
        if refused:
            self.refused[op] += 1
        elif failed:
            self.errors[op] += 1
        h[min(_BUCKETS - 1, int(4 * math.log2(ns)) if ns > 1 else 0)] += 1

    @staticmethod
    def _quantile(h: list[int], q: float) -> float:
        """The upper edge, in microseconds, of the bucket holding quantile q."""
        target = q * sum(h)
        seen = 0
        for i, n in enumerate(h):
            seen += n
            if seen >= target and n:
                return 2 ** ((i + 1) / 4) / 1000
        return 0.0

    def report(self) -> dict[str, dict]:
        return {op: {"count": self.counts[op], "errors": self.errors[op], "refused": self.refused[op],
                     "total_us": round(self.total_ns[op] / 1000, 1),
                     "mean_us": round(self.total_ns[op] / self.counts[op] / 1000, 1),
                     "p50_us": round(self._quantile(h, 0.5), 1),
                     "p99_us": round(self._quantile(h, 0.99), 1)}
                for op, h in sorted(self.hist.items())}
