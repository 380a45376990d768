"""Import a file of `scripts/` as a module (the scripts are not a package)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """`scripts/<name>.py` as module `name` (a `diag/x` name as module `diag_x`), loaded once per
    process (registered in `sys.modules` before it runs: dataclasses look the module up while a
    class is created)."""
    mod_name = name.replace("/", "_")
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_compiled_process(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `scripts/<name>.py` in a process of its own without TRITON_INTERPRET (the offline sm_90
    builds of scripts/kernel_regs.py need the compiler, not the interpreter); the finished process,
    whatever its exit status."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_compiled(name: str, *args: str, timeout: int = 600) -> str:
    """`run_compiled_process`'s stdout, after checking it exited 0."""
    out = run_compiled_process(name, *args, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
