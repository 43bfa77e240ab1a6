"""What fsck found and did."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Finding:
    kind: str
    message: str
    problem: bool = True
    keys: list = field(default_factory=list)  # (volume, offset, footprint) blocks repair may punch
    ino: int = 0  # the inode repair must look at


@dataclass
class Report:
    packdir: str
    findings: list[Finding] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    volumes: int = 0
    data_records: int = 0
    meta_records: int = 0
    files: int = 0
    directories: int = 0
    error: str = ""  # the check could not run at all

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if not f.problem]

    def kinds(self, problems_only: bool = True) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.findings:
            if f.problem or not problems_only:
                out[f.kind] += 1
        return dict(out)

    @property
    def exit_code(self) -> int:
        if self.error:
            return 2
        return 1 if self.problems else 0

    def summary(self) -> str:
        if self.error:
            return f"packfs fsck {self.packdir}: not checked: {self.error}"
        head = (f"packfs fsck {self.packdir}: {self.volumes} volume(s), "
                f"{self.data_records + self.meta_records} records ({self.data_records} data, "
                f"{self.meta_records} meta), {self.files} files, {self.directories} directories: ")
        probs = self.problems
        if not probs:
            head += "clean"
        else:
            head += f"{len(probs)} problem(s) (" + ", ".join(f"{n} {k}" for k, n in sorted(self.kinds().items())) + ")"
        if self.notes:
            head += f"; {len(self.notes)} note(s)"
        return head
