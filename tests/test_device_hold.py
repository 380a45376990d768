"""scripts/device_hold.sh moves docs/data out of the working tree for device calls and back: the
run tool copies every tracked file, and docs/data + .site outgrew its 64 MiB (session 44)."""

import shutil
import subprocess

from script_loader import ROOT


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "device_hold.sh", repo / "scripts")
    (repo / "docs" / "data" / "s1").mkdir(parents=True)
    (repo / "docs" / "data" / "s1" / "log.txt").write_bytes(b"x" * (3 << 20))
    (repo / "README.md").write_text("r\n")
    (repo / ".site").mkdir()
    (repo / ".site" / "site.tar.xz").write_bytes(b"y" * (2 << 20))
    (repo / ".gitignore").write_text(".site/\n")
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def _sh(repo, *args, hold):
    return subprocess.run(["bash", str(repo / "scripts" / "device_hold.sh"), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOLD": str(hold)}, timeout=60)


def test_hold_and_restore(tmp_path):
    repo = _repo(tmp_path)
    hold = tmp_path / "held"
    r = _sh(repo, "size", hold=hold)
    assert r.returncode == 0 and "tree 3 MiB + .site 2 MiB = 5 MiB" in r.stdout, r.stdout + r.stderr
    r = _sh(repo, "hold", hold=hold)
    assert r.returncode == 0 and "tree 0 MiB + .site 2 MiB" in r.stdout, r.stdout + r.stderr
    assert not (repo / "docs" / "data").exists() and (hold / "s1" / "log.txt").stat().st_size == 3 << 20
    assert _sh(repo, "hold", hold=hold).returncode == 2  # nothing left to hold
    (repo / "docs" / "data").mkdir()
    r = _sh(repo, "restore", hold=hold)
    assert r.returncode == 2 and "by hand" in r.stderr  # never over a docs/data that came back
    (repo / "docs" / "data").rmdir()
    r = _sh(repo, "restore", hold=hold)
    assert r.returncode == 0 and (repo / "docs" / "data" / "s1" / "log.txt").exists() and not hold.exists()
    status = subprocess.run(["git", "status", "--short"], cwd=repo, capture_output=True, text=True).stdout
    assert status == ""
    assert _sh(repo, "restore", hold=hold).returncode == 2  # nothing held
