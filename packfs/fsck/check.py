"""The read-only check of a pack: scan the volumes, replay the log as mount would, and
cross-check the result."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..core import pack as packmod
from ..core.catalog import CatalogError
from ..core.recovery import PackDamaged, load_namespace, replay
from ..namespace.namespace import Namespace
from ..progress import QUIET, Progress
from ..store import records
from ..store.disk import Disk
from ..store.volumes import Volumes, volume_name
from .crosscheck import cross_check
from .replay import ReadOnlyDisk, commits_after, dead_listed, open_catalog, release_orphans, replay_tolerant
from .report import Finding, Report
from .scan import Scan, scan_volumes


@dataclass
class State:
    """What a check learned that its repair needs: the replayed namespace, the scan, where
    the log ends, and whether only a tolerant replay can keep every commit."""
    ns: Namespace | None = None
    scan: Scan | None = None
    catalog_pos: tuple[int, int] = (1, 0)
    end: tuple[int, int] = (1, 0)
    tail: int = 0
    tolerant: bool = False  # mount's replay would lose commits or refuse: repair replays tolerantly
    pack_id: int = 0


def check_pack(packdir: str, disk: Disk, report: Report, progress: Progress = QUIET) -> State:
    """Add to report what is wrong with the pack; the state repair starts from."""
    st = State()
    try:
        info = packmod.read_marker(packdir)
    except packmod.PackError as e:
        report.error = str(e)
        return st
    st.pack_id = info["pack_id"]
    try:
        catalog = open_catalog(os.path.join(packdir, "catalog.sqlite"), writable=False)
    except CatalogError as e:
        report.findings.append(Finding("catalog", f"{e}; fsck cannot repair a damaged catalog"))
        return st
    try:
        if catalog.settings.get("pack_id") != st.pack_id:
            report.findings.append(Finding("catalog", "the catalog belongs to another pack"))
            return st
        s = catalog.settings
        st.catalog_pos = (s["volume"], s["offset"])
        voldir = os.path.join(packdir, "volumes")
        ro = ReadOnlyDisk(disk)
        scan_vols = Volumes(disk, voldir, st.pack_id, 1 << 62, 0)
        try:
            st.scan = scan = scan_volumes(disk, scan_vols, progress)
        finally:
            scan_vols.close()
        report.volumes = len(scan.sizes)
        report.data_records = sum(1 for r in scan.records.values() if r.header.rtype == records.DATA)
        report.meta_records = len(scan.records) - report.data_records
        progress.step(f"{len(scan.records):,} records read; loading the catalog and replaying the log")
        ns = load_namespace(catalog)
        vols = Volumes(ro, voldir, st.pack_id, 1 << 62, 0)
        ns.table.read_trailer = vols.read_trailer
        try:
            rec = replay(ns, vols, s["volume"], s["offset"], s["seq"])
            st.end = (vols.active, vols.tail)
            st.tail = rec.truncated_bytes
        except PackDamaged as e:
            report.findings.append(Finding("damaged-log", f"mount refuses this pack: {e}"))
            st.tolerant = True
            ns = load_namespace(catalog)
            ns.table.read_trailer = vols.read_trailer
            st.end, _, _, stale = replay_tolerant(ns, vols, s["volume"], s["offset"], s["seq"], scan)
            for ino in sorted(stale):
                report.findings.append(Finding(
                    "stale-map", f"inode {ino}: its extent map was logged as edits after a damaged record, so "
                    "it may show older contents where a commit the damage took changed it"))
            release_orphans(ns)
        except BaseException:
            vols.close()
            raise
        st.ns = ns
        tail_records = [r for k, r in scan.records.items() if k >= st.end]
        tail_garbage = [g for g in scan.garbage if (g[0], g[1]) >= st.end]
        st.tail = len(tail_records) + len(tail_garbage)
        if st.tail:
            report.findings.append(Finding(
                "uncommitted-tail", f"volume {volume_name(st.end[0])} @ {st.end[1]}: {len(tail_records)} record(s) "
                f"and {len(tail_garbage)} damaged region(s) after the last commit (an unclean stop left them; "
                "they were never acknowledged; the next mount cuts them)", problem=False))
        lost = commits_after(scan, st.end, vols, disk)
        if lost and not st.tolerant:
            report.findings.append(Finding(
                "lost-commits", f"volume {volume_name(st.end[0])} @ {st.end[1]}: the log ends at a damaged record, "
                f"but {lost} intact commit(s) follow it. Mount cuts them as an unacknowledged tail, which they "
                "are if a power cut hit a group commit; if not, the record was damaged later and --repair "
                "keeps them"))
            st.tolerant = True
        to_free = set(ns.frees) | dead_listed(catalog)
        progress.step(f"cross-checking {len(ns):,} inodes against the records")
        try:
            report.findings += cross_check(ns, scan, st.catalog_pos, st.end, to_free)  # (it reads records' xattrs)
        finally:
            vols.close()
        report.directories, report.files, _ = ns.table.usage()
    finally:
        catalog.close()
    return st
