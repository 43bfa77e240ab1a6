"""Delete-heavy workload: the backing disk usage stays bounded (punched holes return space)."""
from __future__ import annotations

import os

from fsutil import backing_usage, fsync_dir, read_file, write_file
from mounts import mounted

KiB, MiB = 1 << 10, 1 << 20
FILES, SIZE, KEEP, ROUNDS = 2000, 64 * KiB, 100, 4
SLACK = 32 * MiB  # catalog, its WAL, and records not yet punched


def _data(r: int, i: int) -> bytes:
    return (b"%d-%d;" % (r, i)).ljust(16, b".") * (SIZE // 16)


def test_delete_heavy_usage_stays_bounded(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    kept: dict[str, bytes] = {}
    usage = []
    for r in range(ROUNDS):
        with mounted(packdir, mnt):
            os.makedirs(mnt / f"round{r}")
            for i in range(FILES):
                write_file(mnt / f"round{r}" / f"obj{i:05d}", _data(r, i))
            fsync_dir(mnt / f"round{r}")
            for i in range(FILES):
                name = f"round{r}/obj{i:05d}"
                if i < KEEP:
                    kept[name] = _data(r, i)
                else:
                    os.unlink(mnt / name)
            fsync_dir(mnt / f"round{r}")
            assert len(os.listdir(mnt / f"round{r}")) == KEEP
        with mounted(packdir, mnt):
            # Measured after a remount: the daemon checkpointed and punched what died.
            used = backing_usage(packdir)
            usage.append(used)
            live = len(kept) * (SIZE + 4 * KiB)
            assert used <= live + SLACK, (
                f"after round {r} ({(r + 1) * FILES} files of 64 KiB written, {len(kept)} kept = "
                f"{live // MiB} MiB live) the pack occupies {used / MiB:.1f} MiB; rounds so far: "
                f"{[round(u / MiB, 1) for u in usage]} MiB")
    with mounted(packdir, mnt):
        for name, data in list(kept.items())[::37]:
            assert read_file(mnt / name) == data
        # Growth per round is the kept data, not the deleted data.
        print("pack usage after each round (MiB):", [round(u / MiB, 1) for u in usage])
        per_round = (usage[-1] - usage[0]) / (ROUNDS - 1)
        assert per_round <= KEEP * (SIZE + 4 * KiB) + 4 * MiB, [round(u / MiB, 1) for u in usage]
