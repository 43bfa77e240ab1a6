"""A time column of the inode table, kept as 4-byte distances from the slot's mtime.

An inode's three times took 24 B of its slot, yet they mostly lie within moments of one
another: a Swift object's file is created, written and renamed into place within
milliseconds, a hash directory gets its file as soon as it is made, and a directory's
mtime and ctime change together. So the table keeps `ctime` as its distance after mtime
and `atime` as its distance before it, in ns, as u32. A time that does not fit (a
suffix directory that gains a hash directory minutes after its making, a utime of an old
tree) is kept whole in a side array, and the column holds its index there, from FAR up:
8 B more for that slot, where a dict entry took ~120 B. Once more than half of the
slots would need one, the column holds whole times instead ("q"), and stays so.
"""
from __future__ import annotations

import itertools
import logging
import operator
from array import array
from typing import Callable

log = logging.getLogger(__name__)

FAR = 3 << 30  # column values from here on index the far times: distances below it (3.2 s) fit
_FAR_SLOTS = (1 << 32) - FAR  # how many far times a u32 column can index
_WHOLE_MIN = 1024  # a column with fewer far times than this stays as it is


class OffsetTimes:
    """One time column: distances from mtime where they fit, whole times where not.

    `after` says which way: ctime is at or after mtime (after=True), atime at or before
    it. Every slot's value is valid, free slots' too (0: the time is mtime), so a value
    from FAR up always names a far time this slot owns.
    """

    __slots__ = ("name", "sign", "mtimes", "column", "far", "spare")

    def __init__(self, name: str, after: bool, mtimes: Callable[[], array]) -> None:
        self.name = name
        self.sign = 1 if after else -1
        self.mtimes = mtimes  # the table's mtime column (the table may replace it)
        self.column = array("I")
        self.far = array("q")  # whole times, by index
        self.spare = array("I")  # indexes in `far` no slot uses

    @property
    def whole(self) -> bool:
        return self.column.typecode == "q"

    def far_count(self) -> int:
        """How many slots hold their time whole beside the column."""
        return len(self.far) - len(self.spare)

    def nbytes(self) -> int:
        return self.column.itemsize * len(self.column) + 8 * len(self.far) + 4 * len(self.spare)

    def get(self, ino: int, mtime: int) -> int:
        """A slot's time, given the slot's mtime."""
        column = self.column
        v = column[ino]
        if column.typecode == "q":
            return v
        return mtime + self.sign * v if v < FAR else self.far[v - FAR]

    def set(self, ino: int, value: int, mtime: int) -> None:
        """Set a slot's time, given the slot's mtime (already set)."""
        column = self.column
        if column.typecode == "q":
            column[ino] = value
            return
        old = column[ino]
        distance = (value - mtime) * self.sign
        if 0 <= distance < FAR:
            if old >= FAR:
                self.spare.append(old - FAR)
            column[ino] = distance
        elif old >= FAR:
            self.far[old - FAR] = value
        elif self.far_count() >= max(_WHOLE_MIN, len(column) // 2) or \
                (not self.spare and len(self.far) >= _FAR_SLOTS):
            self._go_whole()
            self.column[ino] = value
        elif self.spare:
            i = self.spare.pop()
            self.far[i] = value
            column[ino] = FAR + i
        else:
            column[ino] = FAR + len(self.far)
            self.far.append(value)

    def keep(self, ino: int, old_mtime: int, mtime: int) -> None:
        """The slot's mtime moved from old_mtime (a write): its time stays as it was."""
        column = self.column
        v = column[ino]
        if v >= FAR or column.typecode == "q":
            return  # whole, here or beside the column
        distance = v - self.sign * (mtime - old_mtime)
        if 0 <= distance < FAR:
            column[ino] = distance
        else:
            self.set(ino, old_mtime + self.sign * v, mtime)

    def clear(self, ino: int) -> None:
        """A freed slot: its far time, if any, goes back."""
        column = self.column
        if column.typecode == "I" and column[ino] >= FAR:
            self.spare.append(column[ino] - FAR)
        column[ino] = 0

    def _go_whole(self) -> None:
        """Hold whole times from now on: too many are far from their mtimes."""
        column, mtimes = self.column, self.mtimes()
        whole = array("q", map(operator.add if self.sign > 0 else operator.sub, mtimes, column))
        for ino in itertools.compress(range(len(column)), map(FAR.__le__, column)):
            whole[ino] = self.far[column[ino] - FAR]
        self.column, self.far, self.spare = whole, array("q"), array("I")
        log.info("%s: %d slots, too many times far from their mtimes: whole times from now on",
                 self.name, len(whole))
