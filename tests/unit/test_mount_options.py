"""Mount option parsing: values, units, and a clear error for what cannot be right."""
from __future__ import annotations

import pytest

from packfs.options import OptionError, Options


def test_commit_interval_takes_seconds_and_zero_turns_it_off():
    assert Options.parse(None).commit_interval == 5.0  # ext4's commit=5
    assert Options.parse("commit_interval=0.5").commit_interval == 0.5
    assert Options.parse("commit_interval=0").commit_interval == 0


@pytest.mark.parametrize("bad", ["commit_interval=-1", "commit_interval=nan", "commit_interval=inf",
                                 "commit_interval=", "commit_interval=soon"])
def test_a_commit_interval_that_cannot_be_right_is_refused(bad):
    with pytest.raises(OptionError, match="commit_interval"):
        Options.parse(bad)


def test_volume_size_is_at_most_4g():
    """A small object's record is addressed by its page in its volume's first 4 GiB."""
    assert Options.parse("volume_size=4G").volume_size == 4 << 30
    with pytest.raises(OptionError, match="volume_size must be at most 4G"):
        Options.parse("volume_size=5G")


def test_mount_help_lists_every_option_with_its_default_and_documentation(capsys):
    """`packfs mount --help` is generated from the options themselves, so it cannot drift."""
    from dataclasses import fields

    from packfs.cli import main
    with pytest.raises(SystemExit) as done:
        main(["mount", "--help"])
    assert done.value.code == 0
    shown = {line.split()[0].split("=")[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ") and not line.lstrip().startswith("-")}
    for f in fields(Options):
        assert f.metadata.get("doc"), f"{f.name} has no documentation in options.py"
        assert f.name in shown, f"packfs mount --help does not list {f.name}"
        assert f.metadata["doc"] in shown[f.name]
    assert shown["disk_chunk_size"].split()[1] == "1M" and shown["writeback_cache"].split()[1] == "off"


def test_atime_modes():
    """relatime by default, as the kernel's; mount(8)'s `atime` only undoes `noatime`."""
    assert Options.parse(None).atime == "relatime"
    assert Options.parse("noatime").atime == "noatime"
    assert Options.parse("strictatime").atime == "strictatime"
    assert Options.parse("noatime,relatime").atime == "relatime"
    assert Options.parse("noatime,atime").atime == "relatime"
    assert Options.parse("strictatime,atime").atime == "strictatime"
    with pytest.raises(OptionError, match="noatime takes no value"):
        Options.parse("noatime=1")
    with pytest.raises(OptionError, match="unknown mount option 'nostrictatime'"):
        Options.parse("nostrictatime")


def test_dev_suid_exec_reach_the_kernel():
    """nodev and nosuid by default, as libfuse mounts; each asked for is passed on."""
    from packfs.fuse.daemon import fuse_options
    default = fuse_options("/p", Options.parse(None))
    assert not default & {"dev", "suid", "noexec"}  # libfuse then mounts nodev,nosuid
    assert {"dev", "suid", "noexec"} <= fuse_options("/p", Options.parse("dev,suid,noexec"))
    assert not fuse_options("/p", Options.parse("dev,nodev,suid,nosuid,exec")) & {"dev", "suid", "noexec"}
    assert "noatime" in fuse_options("/p", Options.parse("noatime"))
