"""--repair: recover the log as mount does, make the pack consistent without losing an
intact fsync'd file, write one catalog checkpoint, and only then punch what nothing
refers to."""
from __future__ import annotations

import os
import stat
from collections import defaultdict
from typing import Callable

from ..core import journal
from ..core.recovery import load_namespace, replay
from ..namespace.inodes import ROOT, Inode
from ..namespace.namespace import Namespace
from ..progress import QUIET, Progress
from ..store import extents as ext
from ..store import records
from ..store.disk import Disk
from ..store.volumes import Volumes, volume_name
from .check import State
from .crosscheck import cross_check, describe, extent_problem, paths_of
from .replay import dead_listed, open_catalog, release_orphans, replay_tolerant
from .report import Report
from .scan import BLOCK, scan_volumes

LOST_FOUND = b"lost+found"
XATTR = b"user.packfs.fsck"


def repair_pack(packdir: str, disk: Disk, report: Report, first: State, out: Callable[[str], None],
                progress: Progress = QUIET) -> None:
    """Fix what check_pack found (first), saying each action through out."""
    def did(line: str) -> None:
        report.actions.append(line)
        out(f"repair: {line}")

    catalog = open_catalog(os.path.join(packdir, "catalog.sqlite"), writable=True)
    catalog.upgrade()  # what the repair writes may use this format (compressed xattrs)
    voldir = os.path.join(packdir, "volumes")
    vols = Volumes(disk, voldir, first.pack_id, 1 << 62, 0)
    try:
        s = catalog.settings
        listed = dead_listed(catalog)
        progress.step("repairing: loading the catalog and replaying the log")
        ns = load_namespace(catalog)
        ns.table.read_trailer = vols.read_trailer
        replayed: list = []
        if not first.tolerant:
            rec = replay(ns, vols, s["volume"], s["offset"], s["seq"])
            replayed = list(rec.metas)
            if rec.replayed:
                did(f"replayed {rec.replayed} commit(s) after the checkpoint, as mount does")
            if first.tail:
                did(f"cut the uncommitted tail after volume {volume_name(vols.active)} @ {vols.tail}, as mount does")
        else:
            assert first.scan is not None
            end, replayed, seq, stale = replay_tolerant(ns, vols, s["volume"], s["offset"], s["seq"], first.scan)
            did(f"replayed {len(replayed)} intact commit(s) past damaged records; the log now ends at "
                f"volume {volume_name(end[0])} @ {end[1]}")
            if stale:
                did(f"{len(stale)} file(s) whose extent edits were logged after a damaged record may show "
                    f"older contents where a lost commit changed them: inodes "
                    f"{', '.join(map(str, sorted(stale)[:20]))}{' ...' if len(stale) > 20 else ''}")
            for vol in [v for v in vols.existing() if v >= end[0]]:
                fd = vols.fd(vol)
                keep = end[1] if vol == end[0] else 0
                if disk.size(fd) > keep:
                    disk.truncate(fd, keep)
                    disk.fdatasync(fd)
            if first.tail:
                did(f"cut the uncommitted tail after volume {volume_name(end[0])} @ {end[1]}")
            release_orphans(ns)
            vols.open_tail(end[0], end[1], seq)
        end = (vols.active, vols.tail)
        scan = scan_volumes(disk, vols, progress)
        progress.step("cross-checking the namespace against the records")
        findings = cross_check(ns, scan, (s["volume"], s["offset"]), end, set(ns.frees) | listed)
        punch: list[tuple[int, int, int]] = []
        lost_found: Inode | None = None

        def lost_and_found() -> Inode:
            nonlocal lost_found
            if lost_found is None:
                node = ns.lookup(ROOT, LOST_FOUND)
                if node is None or not node.is_dir:
                    name = LOST_FOUND if node is None else LOST_FOUND + b".fsck"
                    node = ns.create(ROOT, name, stat.S_IFDIR | 0o700, 0, 0)
                    did(f"created /{name.decode()}")
                lost_found = node
            return lost_found

        paths = paths_of(ns)
        moved: set[int] = set()
        for f in findings:
            if f.kind == "corrupt-file":
                node = ns.get(f.ino)
                extents = list(node.extent_list())
                bad = [e for e in extents if extent_problem(node, e, scan)]
                for e in bad:  # damaged records die with the extents; intact ones of other files stay
                    r = scan.records.get((e[2], e[3]))
                    if r is not None and not r.intact:
                        punch.append((r.volume, r.offset, r.header.footprint))
                ranges = ", ".join(f"{e[0]}-{e[0] + e[1] - 1}" for e in bad)
                for e in bad:
                    ext.punch(extents, e[0], e[0] + e[1])
                    _drop_ref(ns, ext.key(e))
                node.extents = extents
                old = paths.get(node.ino, [])
                note = f"fsck: damaged bytes {ranges} are now holes; was {', '.join(old) or 'unnamed'}".encode()
                x = dict(node.xattrs or {})
                x[XATTR] = note[:65536]
                node.xattrs = x
                _move_to_lost_found(ns, node, lost_and_found())
                moved.add(node.ino)
                ns.touch(node)
                did(f"moved {', '.join(old) or f'inode {node.ino}'} to /lost+found/#{node.ino}; "
                    f"damaged bytes {ranges} are holes now")
            elif f.kind in ("orphan-record", "stale-meta", "torn-record", "garbage"):
                punch += f.keys
            elif f.kind == "dangling-entry":
                d = ns.get(f.ino)
                for name, child in d.children():
                    if child not in ns:
                        d.del_child(name)
                        ns._touch_dirent(d.ino, name)
                        ns.touch(d)
                        did(f"removed the entry {name!r} of {describe(paths, d.ino)} (inode {child} does not exist)")
            elif f.kind == "extent-beyond-size":
                node = ns.get(f.ino)
                ns.truncate_extents(node, node.size)
                did(f"dropped the data of {describe(paths, node.ino)} beyond its size {node.size}")
        # Link counts, parents, reachability: recount from the entries.
        for f in findings:
            if f.kind == "unreachable" and f.ino in ns and f.ino not in moved:
                node = ns.get(f.ino)
                _move_to_lost_found(ns, node, lost_and_found())
                did(f"linked unreachable inode {f.ino} as /lost+found/#{f.ino}")
        _fix_links(ns, did)
        _fix_refs(ns, did)
        for f in findings:
            if f.kind == "next-ino":
                ns.next_ino = ns.max_ino() + 1
                did(f"next inode number set to {ns.next_ino}")
        # One checkpoint of everything recovery and repair changed, at the end of the log.
        ns.take_journal_changes()  # into the catalog's pending changes
        ns.table.compress_xattrs()  # the catalog gets the xattrs small, as from a mount's checkpoint
        rows, removed, dirents, refs = journal.snapshot(ns, ns.take_catalog_changes().changes())
        position = {"volume": vols.active, "offset": vols.tail, "seq": vols.seq, "next_ino": ns.next_ino}
        # Everything to punch, as (volume, offset, bytes): dead records and damaged blocks.
        todo = sorted({(v, o, records.footprint(n)) for v, o, n in [*ns.take_frees(), *replayed, *listed]} |
                      {(v, o, -(-n // BLOCK) * BLOCK) for v, o, n in punch})
        todo = [(v, o, n) for v, o, n in todo if (v, o) < end and v in scan.sizes]
        dead = [(v, o, n - records.HEADER_SIZE) for v, o, n in todo]  # footprint(n - 48) == n
        catalog.checkpoint(rows, removed, dirents, refs, position, dead)
        did(f"wrote a catalog checkpoint at volume {volume_name(vols.active)} @ {vols.tail}")
        # Only now that nothing refers to them: punch dead records and damaged blocks.
        touched = set()
        for v, o, n in todo:
            n = min(n, scan.sizes[v] - o)
            if n <= 0:
                continue
            disk.punch_hole(vols.fd(v), o, -(-n // BLOCK) * BLOCK)
            touched.add(v)
        for v in sorted(touched):
            disk.fdatasync(vols.fd(v))
        if punch:
            did(f"punched {len(punch)} orphan, stale or damaged region(s)")
    finally:
        vols.close()
        catalog.close()


def _drop_ref(ns: Namespace, key: tuple) -> None:
    """An extent of a damaged record is gone; fix the shared-record count, never free it (it is damaged)."""
    if key in ns.refs:
        n = ns.refs[key] - 1
        ns.set_ref(key, n)
        ns.journal_changes.refs.add(key)


def _move_to_lost_found(ns: Namespace, node: Inode, lf: Inode) -> None:
    """Take every name of node away and link it as lost+found/#ino."""
    for d in list(ns):
        if not d.is_dir:
            continue
        for name, child in d.children():
            if child == node.ino:
                d.del_child(name)
                ns._touch_dirent(d.ino, name)
                ns.touch(d)
    name = f"#{node.ino}".encode()
    lf.set_child(name, node.ino)
    ns._touch_dirent(lf.ino, name)
    ns.touch(lf)
    if node.is_dir:
        node.parent = lf.ino
    node.nlink = 2 if node.is_dir else 1
    ns.touch(node)


def _fix_links(ns: Namespace, did: Callable[[str], None]) -> None:
    names: dict[int, int] = defaultdict(int)
    subdirs: dict[int, int] = defaultdict(int)
    for d in ns:
        for name, child in d.children():
            names[child] += 1
            c = ns.find(child)
            if c is not None and c.is_dir:
                subdirs[d.ino] += 1
                if c.parent != d.ino:
                    c.parent = d.ino
                    ns.touch(c)
                    did(f"parent of directory inode {child} set to {d.ino}")
    for node in list(ns):
        want = 2 + subdirs[node.ino] if node.is_dir else names[node.ino]
        if node.ino != ROOT and names[node.ino] == 0:
            continue  # unreachable: handled by the caller
        if node.nlink != want:
            did(f"link count of inode {node.ino} set from {node.nlink} to {want}")
            node.nlink = want
            ns.touch(node)


def _fix_refs(ns: Namespace, did: Callable[[str], None]) -> None:
    count: dict[tuple, int] = defaultdict(int)
    for node in ns:
        for e in node.extent_list() if node.is_reg else ():
            count[ext.key(e)] += 1
    for k in set(ns.refs) | {k for k, n in count.items() if n > 1}:
        want = count.get(k, 0)
        if ns.refs.get(k, 1) != max(want, 1) and (want > 1 or k in ns.refs):
            did(f"shared-record count of {volume_name(k[0])} @ {k[1]} set to {want}")
            ns.set_ref(k, want)
            ns.journal_changes.refs.add(k)
