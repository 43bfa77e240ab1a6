"""Progress lines on stderr for the offline commands (fsck, import), which take minutes
on a large pack or tree: a plain value any layer may use."""
from __future__ import annotations

import sys
import time
from typing import Callable


class Progress:
    """A line on stderr every `every` seconds while a command works. A run that ends
    sooner prints nothing."""

    def __init__(self, every: float = 2.0, write: Callable[[str], None] | None = None,
                 command: str = "fsck") -> None:
        self.every = every
        self.write = write or (lambda line: print(f"packfs {command}: {line}", file=sys.stderr, flush=True))
        self._started = time.monotonic()
        self._due = self._started + every

    def __call__(self, line: Callable[[], str]) -> None:
        """Report how far the current step is, if the last line is old enough (line is made only then)."""
        now = time.monotonic()
        if now >= self._due:
            self._due = now + self.every
            self.write(line())

    def step(self, line: str) -> None:
        """A new step begins: say so, once the whole run has taken long enough to report at all."""
        now = time.monotonic()
        if now >= self._started + self.every:
            self._due = now + self.every
            self.write(line)


QUIET = Progress(write=lambda line: None)
