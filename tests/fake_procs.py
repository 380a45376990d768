"""Helpers for the tests that run scripts against fake SGLang servers (a Python file started
through a `python`-like wrapper, as the scripts start `python -m sglang.launch_server`)."""

import inspect
import json
import os
import stat
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path


class JsonHandler(BaseHTTPRequestHandler):
    """Quiet handler with a JSON reply helper; GET /health answers 200, any other GET 404."""

    def log_message(self, *a):
        pass

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._json(200 if self.path == "/health" else 404, {})


# The same class as source, for the fake servers that run as separate processes: their source
# starts with it (`FAKE = JSON_HANDLER_SOURCE + r"""..."""`).
JSON_HANDLER_SOURCE = ("import json\nfrom http.server import BaseHTTPRequestHandler\n\n\n"
                       + inspect.getsource(JsonHandler) + "\n\n")


def fake_python(tmp_path: Path, server_source: str, name: str = "fake_server.py") -> str:
    """Write `server_source` and an executable `fakepython` that runs it with any arguments;
    returns the wrapper's path (pass it where a script takes `--python`)."""
    server = tmp_path / name
    server.write_text(server_source)
    py = tmp_path / "fakepython"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} {server} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return str(py)


def assert_all_stopped(pidfile: Path, timeout_s: float = 10.0) -> None:
    """Every pid the fake servers wrote to `pidfile` (servers and their children) has exited; a
    zombie (exited, not yet reaped by its parent) counts as exited."""
    pids = [int(x) for line in pidfile.read_text().split("\n") if line for x in line.split()]
    assert pids
    deadline = time.time() + timeout_s
    alive = pids
    while alive and time.time() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                if Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                    alive.append(pid)
            except (ProcessLookupError, FileNotFoundError, IndexError):
                pass
        if alive:
            time.sleep(0.2)
    assert not alive, f"processes still running: {alive}"
