"""scripts/ci_local.sh runs `.ci/run` on a fresh clone and deletes the clone afterwards: eight kept
clones (9 GB each) once left the CI machine's disk too full for CI's own install."""

import shutil
import subprocess

from script_loader import ROOT


def _repo(tmp_path, ci_body):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".ci").mkdir()
    shutil.copy(ROOT / "scripts" / "ci_local.sh", repo / "scripts" / "ci_local.sh")
    (repo / ".ci" / "run").write_text("#!/usr/bin/env bash\n" + ci_body)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    sha = subprocess.run(git + ["rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                         text=True).stdout.strip()
    return repo, sha


def _run(repo, clone, log, **env):
    return subprocess.run(["bash", str(repo / "scripts" / "ci_local.sh")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "CI_DIR": str(clone), "CI_LOG": str(log), **env},
                          timeout=120)


def test_runs_the_clone_and_deletes_it(tmp_path):
    # The clone's .ci/run sees the committed tree (a marker file) and a failing status comes back.
    repo, sha = _repo(tmp_path, 'test -f scripts/ci_local.sh && echo "from $(pwd)"; exit 3\n')
    clone, log = tmp_path / "clone", tmp_path / "ci.log"
    r = _run(repo, clone, log)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"ci_local: {sha} rc=3" in r.stdout
    text = log.read_text()
    assert f"from {clone}" in text
    assert not clone.exists()


def test_keeps_the_clone_when_asked(tmp_path):
    repo, sha = _repo(tmp_path, "echo fine\n")
    clone, log = tmp_path / "clone", tmp_path / "ci.log"
    r = _run(repo, clone, log, CI_KEEP="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (clone / ".ci" / "run").exists()
    assert f"ci_local: {sha} rc=0" in log.read_text()
