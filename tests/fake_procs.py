"""Helpers for the tests that run scripts against fake SGLang servers (a Python file started
through a `python`-like wrapper, as the scripts start `python -m sglang.launch_server`)."""

import inspect
import json
import os
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def serve_until_killed(handler, host: str, port: int, ready_after_s: float = 0.0, announce=None) -> None:
    """A fake server's main loop: serve `handler` on a thread, print SGLang's ready line after
    `ready_after_s` (what the scripts wait for), then block until the process is killed."""
    ThreadingHTTPServer.request_queue_size = 256  # the default backlog (5) stalls bursts of connections
    srv = ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    time.sleep(ready_after_s)
    (announce or (lambda m: print(m, flush=True)))("The server is fired up and ready to roll!")
    while True:
        time.sleep(1)


def launch_server_args(argv: list[str]):
    """What a fake `python -m sglang.launch_server ARGS` was given: (ARGS, opt), where
    `opt(flag, default=None)` is the value after `flag`."""
    assert argv[:2] == ["-m", "sglang.launch_server"], argv
    args = argv[2:]

    def opt(name, default=None):
        return args[args.index(name) + 1] if name in args else default

    return args, opt


# The same as source, for the fake servers that run as separate processes: their source starts
# with it (`FAKE = FAKE_SERVER_PRELUDE + r"""..."""`), takes its flags with
# `launch_server_args(sys.argv[1:])` and ends with `serve_until_killed(H, ...)`.
FAKE_SERVER_PRELUDE = ("import json\nimport threading\nimport time\n"
                       "from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer\n\n\n"
                       + "\n\n".join(inspect.getsource(f) for f in (JsonHandler, serve_until_killed, launch_server_args))
                       + "\n\n")


def fake_python(tmp_path: Path, server_source: str, name: str = "fake_server.py") -> str:
    """Write `server_source` and an executable `fakepython` that runs it with any arguments but
    `-c CODE`; returns the wrapper's path (pass it where a script takes `--python`)."""
    server = tmp_path / name
    server.write_text(server_source)
    py = tmp_path / "fakepython"
    # `-c CODE` (the scripts' questions to the interpreter: package versions, entry points) goes
    # to the real interpreter; anything else starts the fake server.
    py.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then exec {sys.executable} \"$@\"; fi\n"
                  f"exec {sys.executable} {server} \"$@\"\n")
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


def python_without_plugin(tmp_path: Path, server: Path | None = None) -> str:
    """A `python`-like wrapper whose `-c CODE` runs isolated and without site-packages, so that no
    installed distribution (our plugin's entry point included) is visible to it; anything else
    starts `server` (a fake server's source) if given. Returns the wrapper's path."""
    py = tmp_path / "python_without_plugin"
    rest = f"exec {sys.executable} {server} \"$@\"\n" if server else "exit 2\n"
    py.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then exec {sys.executable} -I -S \"$@\"; fi\n{rest}")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return str(py)
