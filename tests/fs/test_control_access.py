"""The control socket is abstract, so any local user can reach it: the daemon answers
only root and its own user, and says why to anyone else."""
from __future__ import annotations

from fsutil import as_user
from mounts import stats

from packfs.fuse import control
from packfs.core import pack


def test_another_user_can_neither_checkpoint_nor_count(packdir, mnt):
    pack_id = pack.read_marker(str(packdir))["pack_id"]
    before = stats(mnt)["checkpoints"]
    replies = as_user(mnt, f"""
        import socket, time
        result = []
        for command in ("sync", "stats"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect({control.address(pack_id)!r})
                time.sleep(0.2)  # a daemon that answered before reading would have closed by now
                s.sendall(json.dumps({{"command": command}}).encode())
                s.shutdown(socket.SHUT_WR)
                result.append(json.loads(s.recv(65536).decode()))
    """)
    assert [r["error"].split(":")[0] for r in replies] == ["permission denied"] * 2, replies
    assert stats(mnt)["checkpoints"] == before
    assert "control request from uid 65534 refused" in (packdir / "packfs.log").read_text()
    assert control.request(pack_id, "sync") == {"ok": True}  # root still may
    assert stats(mnt)["checkpoints"] == before + 1
