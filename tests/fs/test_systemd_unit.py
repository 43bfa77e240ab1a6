"""mount/packfs@.service brings its device back after the daemon was killed (kill -9, the
OOM killer): its Exec lines, run as systemd runs them (this machine's PID 1 is not systemd),
clear the dead mount, mount the pack again, and what was fsync'd before the kill reads back.

The unit file is parsed; %i and the Environment= values (pointed at this test's paths) are
substituted as systemd does, `$$` becomes `$`, and each command line is split into argv
(systemd's quoting is the shell's for these lines) and run with that environment."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from fsutil import read_file, write_file
from mounts import daemon_pid, force_unmount, is_mounted, kill_daemon

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "mount" / "packfs@.service"
DEVICE = "sdb7"


def unit_lines(path: Path, wanted: str = "[Service]") -> dict[str, list[str]]:
    """Each key of a section and its values in order (backslash-continued lines joined)."""
    section, out = "", {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == wanted:
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


class Unit:
    """The unit's commands for instance DEVICE, with its Environment= pointed at tmp paths."""

    def __init__(self, tmp: Path) -> None:
        self.service = unit_lines(UNIT)
        env = {}
        for assignment in self.service["Environment"]:
            env.update(item.split("=", 1) for item in shlex.split(assignment))
        assert set(env) == {"PACKFS", "PACKFS_PACKS", "PACKFS_NODE_ROOT", "PACKFS_OPTS"}, env
        wrapper = tmp / "packfs"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m packfs.cli "$@"\n')
        wrapper.chmod(0o755)
        env.update(PACKFS=str(wrapper), PACKFS_PACKS=str(tmp / "packs"), PACKFS_NODE_ROOT=str(tmp / "node"))
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.packdir = tmp / "packs" / DEVICE
        self.mountpoint = tmp / "node" / DEVICE

    def run(self, key: str) -> list[int]:
        """Run every command of `key` in order, as systemd would; their exit statuses. A command
        without the `-` prefix that fails stops the list (systemd stops there too)."""
        statuses = []
        for line in self.service[key]:
            ignore = line.startswith("-")
            argv = shlex.split(line.lstrip("-").replace("%i", DEVICE).replace("$$", "$"))
            assert argv[:2] == ["/bin/sh", "-c"], f"{key}: {line}"
            status = subprocess.run(argv, env=self.env, capture_output=True, timeout=300).returncode
            statuses.append(status)
            if status and not ignore:
                break
        return statuses

    def start(self) -> None:
        assert self.run("ExecStartPre") == [0] * len(self.service["ExecStartPre"])
        assert self.run("ExecStart") == [0]
        assert is_mounted(self.mountpoint)

    def cleanup(self) -> None:
        force_unmount(self.mountpoint, self.packdir)


def test_the_unit_brings_a_killed_daemon_back(tmp_path):
    unit = Unit(tmp_path)
    try:
        unit.start()
        first = daemon_pid(unit.packdir)
        write_file(unit.mountpoint / "acked", b"fsync'd before the kill", fsync=True)
        kill_daemon(unit.packdir)
        assert is_mounted(unit.mountpoint)  # dead: stat answers ENOTCONN
        # The main process died: systemd runs ExecStop (which may fail), then ExecStopPost,
        # then, Restart=on-failure, ExecStartPre and ExecStart.
        unit.run("ExecStop")
        assert unit.run("ExecStopPost") == [0]
        assert not is_mounted(unit.mountpoint)
        unit.start()
        assert daemon_pid(unit.packdir) != first
        assert read_file(unit.mountpoint / "acked") == b"fsync'd before the kill"

        # A dead mount ExecStopPost did not clear (systemd itself was stopped meanwhile):
        # ExecStartPre clears it before its mkdir.
        write_file(unit.mountpoint / "second", b"also fsync'd", fsync=True)
        kill_daemon(unit.packdir)
        assert is_mounted(unit.mountpoint)
        unit.start()
        assert read_file(unit.mountpoint / "acked") == b"fsync'd before the kill"
        assert read_file(unit.mountpoint / "second") == b"also fsync'd"

        # A clean stop: unmounted, the daemon gone, nothing left for ExecStopPost.
        pid = daemon_pid(unit.packdir)
        assert unit.run("ExecStop") == [0, 0]  # packfs sync, packfs umount
        assert unit.run("ExecStopPost") == [0]
        assert not is_mounted(unit.mountpoint)
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")")[1][:3]
    finally:
        unit.cleanup()


def test_start_refuses_a_live_mount_and_leaves_it_alone(tmp_path):
    """ExecStartPre clears only a dead mount: a second start while the daemon serves fails
    at `packfs mount` and the mount keeps working."""
    unit = Unit(tmp_path)
    try:
        unit.start()
        write_file(unit.mountpoint / "f", b"live", fsync=True)
        assert unit.run("ExecStartPre") == [0] * len(unit.service["ExecStartPre"])
        assert unit.run("ExecStart") == [1]
        assert read_file(unit.mountpoint / "f") == b"live"
    finally:
        unit.cleanup()


def test_the_unit_and_fstab_wait_for_the_same_services():
    """Both order the devices before packfs.target, which lists the Swift services once."""
    unit = unit_lines(UNIT, "[Unit]")
    assert unit["Before"] == ["packfs.target"] and unit["Wants"] == ["packfs.target"]
    assert "PIDFile" not in unit_lines(UNIT)  # it cannot follow PACKFS_PACKS
    fstab = [ln for ln in (ROOT / "mount" / "fstab.example").read_text().splitlines() if "fuse.packfs  " in ln]
    assert fstab and all("x-systemd.before=packfs.target" in ln for ln in fstab)
    target = (ROOT / "mount" / "packfs.target").read_text()
    for service in ("swift-object.service", "swift-container.service", "swift-account.service",
                    "swift-object-replicator.service", "rsync.service"):
        assert service in target
