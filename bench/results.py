"""Measurements of one run: every sample, medians per filesystem, and notes."""
from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from pathlib import Path

from . import steal
from .util import median, write_json


class Results:
    def __init__(self, part: str, config: dict | None = None):
        self.part = part
        self.config = config or {}
        self.meta: dict[str, dict] = {}       # key -> label, unit, better, group, order
        self.samples: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.details: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.tables: dict[str, dict] = {}     # extra tables (e.g. FUSE requests per op)
        self.notes: list[str] = []
        self.steal = steal.Meter()  # host CPU steal around each case (part.Part)
        self._order = 0
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")

    def define(self, key: str, label: str, unit: str, better: str = "higher", group: str = "",
               **extra) -> None:
        """extra: minor=True keeps a row out of the main table (shown in the detail table);
        absolute=True marks a row that has no meaningful packfs/XFS ratio."""
        if key not in self.meta:
            self._order += 1
            self.meta[key] = {"label": label, "unit": unit, "better": better,
                              "group": group or self.part, "order": self._order, "part": self.part, **extra}

    def add(self, key: str, fs: str, value: float | None, detail: dict | None = None, **define) -> None:
        if define:
            self.define(key, **define)
        if value is not None:
            self.samples[key][fs].append(float(value))
        if detail is not None:
            self.details[key][fs].append(detail)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def medians(self) -> dict[str, dict[str, float]]:
        return {k: {fs: median(v) for fs, v in per.items()} for k, per in self.samples.items()}

    def to_dict(self) -> dict:
        return {
            "part": self.part,
            "started": self.started,
            "host": {"node": platform.node(), "kernel": platform.release(), "python": platform.python_version()},
            "config": self.config,
            "meta": self.meta,
            "samples": {k: dict(v) for k, v in self.samples.items()},
            "medians": self.medians(),
            "details": {k: dict(v) for k, v in self.details.items()},
            "tables": self.tables,
            "notes": self.notes,
            "steal": self.steal.to_dict(),
        }

    def save(self, outdir: Path) -> Path:
        path = outdir / f"{self.part}.json"
        write_json(path, self.to_dict())
        return path


def load(path: Path) -> dict:
    return json.loads(path.read_text())
