"""The namespace mount would serve, compared with what the volumes hold: extents,
orphans, stale journal records, damaged blocks, shared-record counts, entries, link
counts, parents, reachability and xattrs. Every finding names the files by path."""
from __future__ import annotations

from collections import defaultdict

from ..errors import FsError
from ..namespace.inodes import ROOT, Inode
from ..namespace.namespace import Namespace
from ..store import extents as ext
from ..store import records
from ..store.volumes import volume_name
from .report import Finding
from .scan import BLOCK, Scan, Scanned


def paths_of(ns: Namespace) -> dict[int, list[str]]:
    """Every inode reachable from the root, with its paths (a few per inode)."""
    out: dict[int, list[str]] = {ROOT: ["/"]}
    stack = [(ROOT, "")]
    seen_dirs = {ROOT}
    while stack:
        ino, prefix = stack.pop()
        node = ns.find(ino)
        if node is None or not node.is_dir:
            continue
        for name, child in sorted(node.children()):
            p = prefix + "/" + name.decode("utf-8", "surrogateescape")
            lst = out.setdefault(child, [])
            if len(lst) < 4:
                lst.append(p)
            c = ns.find(child)
            if c is not None and c.is_dir and child not in seen_dirs:
                seen_dirs.add(child)
                stack.append((child, p))
    return out


def describe(paths: dict[int, list[str]], ino: int) -> str:
    p = paths.get(ino)
    if p:
        return f"{p[0]} (inode {ino})" + (f" also {', '.join(p[1:])}" if len(p) > 1 else "")
    return f"inode {ino} (no name)"


def cross_check(ns: Namespace, scan: Scan, checkpoint: tuple[int, int], end: tuple[int, int],
                to_free: set) -> list[Finding]:
    """Compare the namespace mount would serve with what the volumes hold."""
    found: list[Finding] = []
    paths = paths_of(ns)
    refcount: dict[tuple, int] = defaultdict(int)
    bad_inodes: dict[int, list[str]] = defaultdict(list)

    for node in ns:
        if not node.is_reg:
            continue
        top = 0
        for e in node.extent_list():
            k = ext.key(e)
            refcount[k] += 1
            top = max(top, e[0] + e[1])
            what = extent_problem(node, e, scan)
            if what:
                bad_inodes[node.ino].append(f"bytes {e[0]}-{e[0] + e[1] - 1} {what}")
            elif e[4] + e[1] > e[5]:
                bad_inodes[node.ino].append(f"bytes {e[0]}-{e[0] + e[1] - 1} lie outside their record")
        if top > node.size:
            found.append(Finding("extent-beyond-size", f"{describe(paths, node.ino)}: data mapped up to byte {top} "
                                 f"but the size is {node.size}", ino=node.ino))
    for ino, whats in sorted(bad_inodes.items()):
        found.append(Finding("corrupt-file", f"{describe(paths, ino)}: " + "; ".join(whats[:6]) +
                             (f"; and {len(whats) - 6} more" if len(whats) > 6 else ""), ino=ino))

    # Records: torn ones, orphans, stale journal records.
    for (vol, off), r in sorted(scan.records.items()):
        key = r.key
        fp = (vol, off, r.header.footprint)
        if (vol, off) >= end:
            continue  # the uncommitted tail, reported from the replay
        owner = f"inode {r.header.ino}" if r.header.rtype == records.DATA else "journal"
        if not r.intact:
            if key not in refcount:
                found.append(Finding("torn-record", f"volume {volume_name(vol)} @ {off}: torn {owner} record "
                                     f"({r.reason}){_of(paths, r)}", keys=[fp]))
            continue  # referenced ones are reported per file
        if r.header.rtype == records.DATA and key not in refcount:
            if key in to_free:
                found.append(Finding("dead-record", f"volume {volume_name(vol)} @ {off}: dead data record of "
                                     f"{owner}; the next mount punches it", problem=False))
            else:
                found.append(Finding("orphan-record", f"volume {volume_name(vol)} @ {off}: orphan data record of "
                                     f"{owner}{_of(paths, r)}, {r.header.length} bytes no file refers to",
                                     keys=[fp]))
        elif r.header.rtype == records.META and (vol, off) < checkpoint:
            if key in to_free:
                found.append(Finding("dead-record", f"volume {volume_name(vol)} @ {off}: old journal record; "
                                     "the next mount punches it", problem=False))
            else:
                found.append(Finding("stale-meta", f"volume {volume_name(vol)} @ {off}: journal record before the "
                                     "checkpoint position was never punched", keys=[fp]))
    for vol, start, stop, reason in scan.garbage:
        if (vol, start) >= end:
            continue
        stop = min(stop, end[1]) if vol == end[0] else stop
        found.append(Finding("garbage", f"volume {volume_name(vol)} @ {start}-{stop - 1}: "
                             f"{(stop - start + BLOCK - 1) // BLOCK} damaged block(s) ({reason})",
                             keys=[(vol, start, stop - start)]))

    # Shared-record counts.
    for k, n in refcount.items():
        if n > 1 and ns.refs.get(k, 1) != n:
            found.append(Finding("refcount", f"record {volume_name(k[0])} @ {k[1]}: {n} extents refer to it, "
                                 f"the catalog says {ns.refs.get(k, 1)}"))
    for k in ns.refs:
        if refcount.get(k, 0) <= 1:
            found.append(Finding("refcount", f"record {volume_name(k[0])} @ {k[1]}: shared-record count "
                                 f"{ns.refs[k]} but {refcount.get(k, 0)} extent(s) refer to it"))

    # The namespace itself.
    names: dict[int, int] = defaultdict(int)
    subdirs: dict[int, int] = defaultdict(int)
    for node in ns:
        if not node.is_dir:
            continue
        for name, child in node.children():
            c = ns.find(child)
            if c is None:
                found.append(Finding("dangling-entry", f"{describe(paths, node.ino)}: entry {name!r} names inode "
                                     f"{child}, which does not exist", ino=node.ino))
                continue
            names[child] += 1
            if c.is_dir:
                subdirs[node.ino] += 1
                if c.parent != node.ino:
                    found.append(Finding("parent", f"{describe(paths, child)}: directory's parent is {c.parent}, "
                                         f"but it is named in {node.ino}", ino=child))
    for node in ns:
        want = 2 + subdirs[node.ino] if node.is_dir else names[node.ino]
        if node.ino == ROOT:
            pass
        elif node.ino not in paths:
            found.append(Finding("unreachable", f"inode {node.ino} ({_kind(node)}, {node.nlink} link(s)) "
                                 "has no path from the root", ino=node.ino))
            continue
        elif node.is_dir and names[node.ino] > 1:
            found.append(Finding("nlink", f"{describe(paths, node.ino)}: directory has {names[node.ino]} names",
                                 ino=node.ino))
        if node.nlink != want:
            found.append(Finding("nlink", f"{describe(paths, node.ino)}: link count {node.nlink}, should be {want}",
                                 ino=node.ino))
    # Xattrs: every blob must read back (the Swift form is checked against its pickle's CRC).
    for node in ns:
        try:
            node.xattr_names()
        except FsError as e:
            found.append(Finding("unreadable-xattrs", f"{describe(paths, node.ino)}: its xattrs do not read back "
                                 f"({e.args[1]}); left as they are", ino=node.ino))
    top = ns.max_ino()
    if ns.next_ino <= top:
        found.append(Finding("next-ino", f"next inode number {ns.next_ino} is not above the largest, {top}"))
    return found


def _kind(node: Inode) -> str:
    if node.is_dir:
        return "directory"
    if node.is_reg:
        return f"file, {node.size} bytes"
    return "special file"


def _of(paths: dict[int, list[str]], r: Scanned) -> str:
    if r.header.rtype != records.DATA:
        return ""
    p = paths.get(r.header.ino)
    return f" ({p[0]})" if p else ""


def extent_problem(node: Inode, e: ext.Extent, scan: Scan) -> str:
    vol, roff, rlen = e[2], e[3], e[5]
    r = scan.records.get((vol, roff))
    where = f"(volume {volume_name(vol)} @ {roff})"
    if r is None:
        g = scan.garbage_at(vol, roff)
        if g is not None:
            return f"point at a damaged record {where}: {g[3]}"
        if vol not in scan.sizes:
            return f"point into a missing volume {where}"
        return f"point at nothing {where}"
    if not r.intact:
        return f"point at a corrupt record {where}: {r.reason}"
    if r.header.rtype != records.DATA:
        return f"point at a journal record {where}"
    if r.header.ino != node.ino:
        return f"point at a record of inode {r.header.ino} {where}"
    if r.header.length != rlen:
        return f"point at a record of {r.header.length} bytes, not {rlen} {where}"
    return ""
