"""patches/sglang-0.5.17.patch: applies to the installed SGLang 0.5.17 package tree, every hunk
anchor is unique, and the patched files behave (choice listed, register() called from
load_plugins, a missing plugin refused at validation).

The dry run targets the real site-packages tree without modifying it (`patch --dry-run`, or
`git apply --check` where GNU patch is missing); the behavioural checks run on copies.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sglang

PATCH = Path(__file__).resolve().parent.parent / "patches" / "sglang-0.5.17.patch"
ROOT = Path(sglang.__file__).resolve().parent.parent  # the directory that contains sglang/
FILES = ("sglang/srt/server_args.py", "sglang/srt/plugins/__init__.py")


TOOLS = [t for t in ("patch", "git") if shutil.which(t)]
assert TOOLS, "neither GNU patch nor git is installed"


def _cmd(tool: str, *, check: bool) -> list[str]:
    """Run with cwd = the root that contains sglang/ (see the patch header)."""
    if tool == "patch":
        return ["patch", "-p1", "--batch", *(["--dry-run"] if check else []), "-i", str(PATCH)]
    return ["git", "apply", "-p1", *(["--check"] if check else []), str(PATCH)]


def _digest(root: Path) -> dict:
    return {f: (root / f).read_bytes() for f in FILES}


@pytest.mark.parametrize("tool", TOOLS)
def test_patch_applies_to_installed_tree_dry_run(tool):
    before = _digest(ROOT)
    proc = subprocess.run(_cmd(tool, check=True), capture_output=True, text=True, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "FAILED" not in out and "offset" not in out and "fuzz" not in out, out
    assert _digest(ROOT) == before  # the dry run left site-packages alone


def test_patch_touches_only_documented_files_and_anchors_are_unique():
    text = PATCH.read_text()
    targets = re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M)
    assert sorted(targets) == sorted(FILES)
    # each hunk's context+removed lines occur exactly once in the pristine file
    for path, body in re.findall(r"^--- a/(\S+)\n\+\+\+ b/\S+\n(.*?)(?=^--- a/|\Z)", text, flags=re.M | re.S):
        original = (ROOT / path).read_text()
        for hunk in re.split(r"^@@[^\n]*\n", body, flags=re.M)[1:]:
            old = "".join(ln[1:] + "\n" for ln in hunk.splitlines() if ln[:1] in (" ", "-"))
            assert original.count(old) == 1, f"{path}: hunk anchor is not unique:\n{old}"
    # every hunk is explained in docs/upstream-issues.md
    doc = (PATCH.parent.parent / "docs" / "upstream-issues.md").read_text()
    assert "sglang-0.5.17.patch" in doc
    for fn in ("MAMBA_BACKEND_CHOICES", "_handle_mamba_backend", "load_plugins"):
        assert fn in doc and fn in text


def test_patched_copy_behaves(tmp_path):
    for f in FILES:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp_path / f)
    proc = subprocess.run(_cmd(TOOLS[0], check=False), capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    server_args = (tmp_path / FILES[0]).read_text()
    plugins = (tmp_path / FILES[1]).read_text()
    compile(server_args, FILES[0], "exec")
    compile(plugins, FILES[1], "exec")
    assert 'MAMBA_BACKEND_CHOICES = ["triton", "flashinfer", "replayssm"]' in server_args
    assert "sglang_replayssm.require_registered()" in server_args
    assert "sglang_replayssm.register()" in plugins
    # the patched load_plugins() registers the plugin even with the entry point filtered out
    script = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("patched_plugins", {str(tmp_path / FILES[1])!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mod.load_plugins()
import sglang_replayssm
assert sglang_replayssm.STATUS["validate.post_init"] in ("applied", "already applied"), sglang_replayssm.STATUS
print("REGISTERED")
"""
    env = dict(os.environ, SGLANG_PLUGINS="nothing-else")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                         timeout=600)
    assert "REGISTERED" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
