"""scripts/device_site_pack.sh packs the device wheel folders as one archive (.site/site.tar.xz), and
the device scripts unpack it into the site folder before anything else: one carry instead of two
calls that had to land on the same warm machine (sessions 24 and 25 lost calls to that)."""

import shutil
import subprocess
import sys
import zipfile

from script_loader import ROOT


def _wheel(path, pkg, version="0.1"):
    """A minimal pure-Python wheel holding `pkg/__init__.py` and a console script."""
    dist = f"{pkg}-{version}.dist-info"
    files = {
        f"{pkg}/__init__.py": f"WHO = {pkg!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": f"[console_scripts]\n{pkg}-cli = {pkg}:WHO\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    whl = path / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return whl


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for s in ("device_site_pack.sh", "device_e2e.sh", "device_plan.sh"):
        shutil.copy(ROOT / "scripts" / s, repo / "scripts" / s)
    (repo / ".whl").mkdir()
    (repo / ".whl2").mkdir()
    _wheel(repo / ".whl", "sglang")
    _wheel(repo / ".whl2", "tokenizers")
    return repo


def _sh(repo, script, *args, **env):
    e = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "SITE_PACK_XZ": "-1", **env}
    return subprocess.run(["bash", str(repo / "scripts" / script), *args], capture_output=True, text=True,
                          env=e, timeout=300)


def test_pack_then_one_install_call(tmp_path):
    repo = _repo(tmp_path)
    r = _sh(repo, "device_site_pack.sh")
    assert r.returncode == 0, r.stderr
    assert 'carry [".site"]' in r.stdout and "from 2 wheels" in r.stdout
    manifest = (repo / ".site" / "MANIFEST").read_text().split("\n")
    assert any(line.endswith("sglang-0.1-py3-none-any.whl") for line in manifest)
    # On the device: only .site travels (no wheel folders), and one install call has both packages.
    shutil.rmtree(repo / ".whl")
    shutil.rmtree(repo / ".whl2")
    site = tmp_path / "site"
    r = _sh(repo, "device_e2e.sh", "install", SITE=str(site), OUT=str(tmp_path / "out"),
            E2E_WORK=str(tmp_path / "work"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unpacking .site" in r.stdout and "install done" in r.stdout
    assert (site / "sglang" / "__init__.py").read_text() == "WHO = 'sglang'\n"
    assert (site / "tokenizers" / "__init__.py").exists()
    assert (site / ".installed_site").exists() and (site / ".installed_.whl").exists()
    # The console script runs with the device's interpreter, not the packing machine's.
    assert (site / "bin" / "sglang-cli").read_text().splitlines()[0] == "#!/usr/bin/env python3"
    r = _sh(repo, "device_e2e.sh", "install", SITE=str(site), OUT=str(tmp_path / "out"),
            E2E_WORK=str(tmp_path / "work"))
    assert r.returncode == 0 and ".site already unpacked" in r.stdout


def test_pack_refuses_an_archive_over_the_limit(tmp_path):
    repo = _repo(tmp_path)
    r = _sh(repo, "device_site_pack.sh", SITE_PACK_LIMIT_MIB="0")
    assert r.returncode == 3 and "carry .whl and .whl2 instead" in r.stderr
    assert not (repo / ".site" / "site.tar.xz").exists()


def test_install_without_any_wheels_names_the_carry(tmp_path):
    repo = _repo(tmp_path)
    shutil.rmtree(repo / ".whl")
    shutil.rmtree(repo / ".whl2")
    r = _sh(repo, "device_e2e.sh", "install", SITE=str(tmp_path / "site"), OUT=str(tmp_path / "out"),
            E2E_WORK=str(tmp_path / "work"))
    assert r.returncode == 2 and "carry .site, or .whl then .whl2" in r.stderr


def test_jit_cache_packed_on_one_machine_unpacks_on_the_next(tmp_path):
    """`device_plan.sh jit_cache_pack` packs flashinfer's JIT builds; carried as .jitcache, `install`
    unpacks them into the next machine's cache folder once, beside .site."""
    repo = _repo(tmp_path)
    assert _sh(repo, "device_site_pack.sh").returncode == 0
    first = tmp_path / "machine1_cache"
    r = _sh(repo, "device_plan.sh", "jit_cache_pack", JIT_CACHE_HOME=str(first), OUT=str(tmp_path / "out1"))
    assert r.returncode == 1 and "nothing under" in r.stdout  # no flashinfer server ran there
    (first / "flashinfer" / "0.6" / "90a" / "cached_ops" / "batch_prefill").mkdir(parents=True)
    (first / "flashinfer" / "0.6" / "90a" / "cached_ops" / "batch_prefill" / "m.so").write_bytes(b"\x7fELF" * 64)
    (first / "tvm-ffi" / "libs").mkdir(parents=True)
    (first / "tvm-ffi" / "libs" / "t.so").write_bytes(b"tvm")
    r = _sh(repo, "device_plan.sh", "jit_cache_pack", JIT_CACHE_HOME=str(first), OUT=str(tmp_path / "out1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "jit_cache_pack: flashinfer tvm-ffi ->" in r.stdout
    (repo / ".jitcache").mkdir()
    shutil.copy(tmp_path / "out1" / "jit_cache.tar.xz", repo / ".jitcache" / "jit_cache.tar.xz")
    second = tmp_path / "machine2_cache"
    env = dict(SITE=str(tmp_path / "site"), OUT=str(tmp_path / "out2"), E2E_WORK=str(tmp_path / "work"),
               JIT_CACHE_HOME=str(second))
    r = _sh(repo, "device_e2e.sh", "install", **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unpacking .jitcache" in r.stdout and "install done" in r.stdout
    assert (second / "flashinfer" / "0.6" / "90a" / "cached_ops" / "batch_prefill" / "m.so").read_bytes() == b"\x7fELF" * 64
    assert (second / "tvm-ffi" / "libs" / "t.so").read_bytes() == b"tvm"
    r = _sh(repo, "device_e2e.sh", "install", **env)
    assert r.returncode == 0 and ".jitcache already unpacked" in r.stdout
