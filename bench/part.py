"""What every part of `make bench` does around a case: the filesystems in an order rotated
each repetition, a failed case noted instead of ending the run, and the host's CPU steal
measured (steal.py)."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from .results import Results
from .util import log

T = TypeVar("T")


class Part:
    targets: list[Any]  # testbed targets: .name, .mnt, .is_packfs ...
    res: Results

    def _order(self, rep: int) -> list[Any]:
        """Every filesystem once, the first of the previous repetition last."""
        k = rep % len(self.targets)
        return self.targets[k:] + self.targets[:k]

    def _guard(self, what: str, t: Any, fn: Callable[[], T]) -> T | None:
        started = self.res.steal.start()
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            msg = f"{t.name}: {self.res.part} {what} failed: {str(e).strip()[:400]}"
            log("ERROR " + msg)
            self.res.note(msg)
            return None
        finally:
            self.res.steal.stop(t.name, what, started)
