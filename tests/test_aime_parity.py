"""CPU tests of scripts/aime_parity.py: data loading (directory, wheel, installed package), answer
extraction, loop detection, statistics, and whole runs against fake OpenAI-compatible servers
(in-process http.server, and launched through a fake ``sglang.launch_server``)."""

import json
import os
import random
import sys
import threading
import zipfile
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from fake_procs import FAKE_SERVER_PRELUDE, JsonHandler, fake_python
from script_loader import load_script

ap = load_script("aime_parity")


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------


def test_extract_and_score():
    assert ap.score(r"so the answer is \boxed{70}.", "70")
    assert not ap.score(r"so the answer is \boxed{71}.", "70")  # a wrong answer scores 0
    assert not ap.score("no answer at all", "70")
    assert not ap.score(r"\boxed{70}", "not a number")
    # Last occurrence wins; nested braces; \fbox; \boxed without braces.
    assert ap.extract_answer(r"first \boxed{12} then \boxed{\text{34}}") == 34
    assert ap.last_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert ap.extract_answer(r"\fbox{588}") == 588
    assert ap.extract_answer(r"hence \boxed 16 is it") == 16
    assert ap.extract_answer(r"\boxed{x = 5}") == 5
    # "Answer:" line when nothing is boxed; boxed beats the answer line.
    assert ap.extract_answer("reasoning...\nAnswer: 117\n") == 117
    assert ap.extract_answer("**Final Answer:** $279$") == 279
    assert ap.extract_answer("Answer: 5\n" + r"\boxed{6}") == 6
    # Normalisation to 0..999.
    for s, want in [("070", 70), ("$70$", 70), (r"\text{70}", 70), ("70.0", 70), ("70.", 70), ("(211)", 211),
                    (r"\textbf{(019)}", 19), ("1,000", None), ("1000", None), ("-5", None), ("3/4", None),
                    (r"90^\circ", 90), ("", None), (None, None), ("12 apples", None)]:
        assert ap.normalize_int(s) == want, s
    # <think>: the answer region follows the last </think>; none if the reply stops inside <think>.
    assert ap.extract_answer(r"<think>maybe \boxed{1}</think>It is \boxed{2}") == 2
    assert ap.extract_answer(r"<think>maybe \boxed{1} and then") is None
    assert ap.extract_answer(r"prompt-opened think ... </think> \boxed{3}") == 3


def test_loop_detection():
    normal = " ".join(f"Step {i}: we compute a_{i} = {i * i} and check the bound." for i in range(300))
    assert ap.max_ngram_repeats(normal) < 50
    loop = "Let me start. " + "Wait, let me double-check the arithmetic once more. " * 60
    assert 50 <= ap.max_ngram_repeats(loop) < 200
    assert ap.max_ngram_repeats("Hmm. " + "Wait, so x = 3. " * 250) >= 200
    assert ap.max_ngram_repeats("0" * 2000) >= 200  # a digit run: 8-character pieces repeat
    assert ap.max_ngram_repeats(")" * 500) >= 200
    assert ap.max_ngram_repeats("short text") == 0
    # Exactly k repetitions of a unit longer than n: each window occurs k - (straddling) times.
    unit = " ".join(f"w{i}" for i in range(30)) + " "
    assert ap.max_ngram_repeats(unit * 49) == 49
    rec = dict(content=r"\boxed{5}", reasoning=loop, finish_reason="length", completion_tokens=9)
    ann = ap.annotate(rec, "5", 16)
    assert ann["correct"] and ann["loop50"] and not ann["loop200"] and ann["truncated"] and ann["tokens"] == 9


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------


def test_statistics():
    lo, hi = ap.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = ap.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    assert ap.wilson(0, 0) is None
    assert ap.binom_two_sided(0, 10) == pytest.approx(2 / 1024)
    assert ap.binom_two_sided(5, 10) == 1.0 and ap.binom_two_sided(0, 0) == 1.0
    assert ap.binom_two_sided(2, 12) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    m = ap.mcnemar([(True, False)] * 10 + [(True, True)] * 5 + [(False, False)] * 5)
    assert (m["a_only"], m["b_only"]) == (10, 0) and m["p"] == pytest.approx(2 / 1024)
    assert m["rate_a"] == 0.75 and m["rate_b"] == 0.25
    assert ap.mcnemar([(True, True), (False, False)])["p"] == 1.0
    st = ap.sign_test([5, 3, 0, -1])
    assert (st["a_more"], st["b_more"], st["ties"]) == (2, 1, 1) and st["mean_diff"] == pytest.approx(1.75)
    groups = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]] * 5
    ci = ap.problem_bootstrap(groups, draws=500, seed=1)
    assert ci == ap.problem_bootstrap(groups, draws=500, seed=1)  # deterministic
    assert ci[0] < 0.5 < ci[1] and ci[1] - ci[0] > 0.1
    # Problem-level resampling is wider than Wilson on these strongly clustered outcomes.
    w = ap.wilson(30, 60)
    assert ci[1] - ci[0] > w[1] - w[0]
    assert ap.problem_bootstrap([], 10) is None
    paired = dict(n=10, **{t: dict(p=0.5) for t in ap.VERDICT_TESTS})
    assert ap.verdict(paired, 0.05)["verdict"] == "no difference beyond noise"
    paired["loop50"] = dict(p=0.001)
    v = ap.verdict(paired, 0.05)
    assert v["verdict"] == "DIFFERS" and v["reasons"] == ["loop50 (p=0.001)"] and v["threshold"] == 0.0125
    paired["loop50"] = dict(p=0.02)  # below alpha but not below alpha / 4
    assert ap.verdict(paired, 0.05)["verdict"] == "no difference beyond noise"


def test_seeds():
    s = ap.request_seed(0, 2025, "aime25-3", 2)
    assert s == ap.request_seed(0, 2025, "aime25-3", 2) and 0 <= s < 2 ** 31
    assert len({ap.request_seed(0, 2025, "aime25-3", k) for k in range(50)}) == 50
    assert ap.request_seed(1, 2025, "aime25-3", 2) != s


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

ROWS = {y: [dict(id=f"aime{y % 100}-{i}", problem=f"Problem {y}/{i}: find the value of item {i}.",
                 expected_answer=str((y * 7 + i * 37) % 1000)) for i in range(5)] for y in (2024, 2025, 2026)}


def _jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_load_data_sources(tmp_path, monkeypatch):
    # Directory in the exported layout.
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text(_jsonl(ROWS[2024]))
    rows, src = ap.load_year(2024, data_dir=str(d))
    assert rows == ROWS[2024] and src.endswith("aime24.jsonl")
    # The wheel, read as a zip.
    whl = tmp_path / "sgl_eval-0.1.3-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for y, name in ap.YEARS.items():
            z.writestr(ap.WHEEL_DATA.format(name=name), _jsonl(ROWS[y]))
    rows, src = ap.load_year(2025, wheel=str(whl))
    assert rows == ROWS[2025] and "!sgl_eval/_vendored" in src
    # --data-dir wins over the wheel; a missing year in the folder falls through to the wheel.
    assert ap.load_year(2026, data_dir=str(d), wheel=str(whl))[0] == ROWS[2026]
    # Export, then read back from the exported folder.
    files = ap.export_data([2024, 2025, 2026], str(tmp_path / "exp"), wheel=str(whl))
    assert [Path(f).name for f in files] == ["aime24.jsonl", "aime25.jsonl", "aime26.jsonl"]
    assert ap.load_year(2026, data_dir=str(tmp_path / "exp"))[0] == ROWS[2026]
    # Installed package (importlib.resources).
    pkg = tmp_path / "site" / "sgl_eval"
    (pkg / "_vendored/nemo_skills/dataset/aime26").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_vendored/nemo_skills/dataset/aime26/test.txt").write_text(_jsonl(ROWS[2026]))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "sgl_eval", raising=False)
    rows, src = ap.load_year(2026)
    assert rows == ROWS[2026] and "installed" in src
    with pytest.raises(FileNotFoundError, match="aime24"):
        ap.load_year(2024, data_dir=str(tmp_path / "nowhere"))
    (d / "aime25.jsonl").write_text('{"problem": "x"}\n')
    with pytest.raises(ValueError, match="expected_answer"):
        ap.load_year(2025, data_dir=str(d))


# ----------------------------------------------------------------------------------------------
# Fake OpenAI-compatible server
# ----------------------------------------------------------------------------------------------

ANSWERS = {r["problem"]: r["expected_answer"] for rows in ROWS.values() for r in rows}


def make_handler(behaviour: dict, log: list):
    """behaviour: salt (same salt + same seed -> same text), skill (P correct), loop, trunc (fractions)."""

    class H(JsonHandler):
        def do_GET(self):
            if self.path == "/v1/models":
                self._json(200, {"data": [{"id": "fake-model"}]})
            else:
                super().do_GET()

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log.append(req)
            assert self.path == "/v1/chat/completions" and req["model"] == "fake-model"
            prompt = req["messages"][0]["content"]
            problem = prompt.split("\n\n", 1)[1]
            want = int(ANSWERS[problem])
            rng = random.Random(f"{behaviour['salt']}:{req['seed']}")
            u_correct, u_loop, u_trunc = rng.random(), rng.random(), rng.random()
            think = "<think>" + " ".join(f"consider case {k} of {rng.randrange(99)}." for k in range(20)) + "</think>"
            finish = "stop"
            if u_loop < behaviour.get("loop", 0.0):
                content = think + "Wait, let me recompute that product carefully. " * 80
            elif u_trunc < behaviour.get("trunc", 0.0):
                content, finish = "<think>" + "still thinking about the geometry " * 30, "length"
            else:
                ans = want if u_correct < behaviour["skill"] else (want + 1) % 1000
                content = think + f"So the result is \\boxed{{{ans}}}."
            self._json(200, {"choices": [{"message": {"role": "assistant", "content": content},
                                          "finish_reason": finish}],
                             "usage": {"completion_tokens": len(content.split())}})

    return H


@pytest.fixture()
def servers():
    started = []

    def start(**behaviour):
        log = []
        srv = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(behaviour, log))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", log

    yield start
    for s in started:
        s.shutdown()


@pytest.fixture()
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for y, name in ap.YEARS.items():
        (d / f"{name}.jsonl").write_text(_jsonl(ROWS[y]))
    return str(d)


def _run(data_dir, url_a, url_b, out, *extra, n=4):
    return ap.main(["--data-dir", data_dir, "--base-url-a", url_a, "--base-url-b", url_b, "--out", str(out),
                    "--n", str(n), "--concurrency", "8", "--bootstrap", "300", "--quiet",
                    "--temperature", "0.7", "--max-tokens", "512", *extra])


def test_identical_servers_no_difference(data_dir, servers, tmp_path, capsys):
    url_a, log_a = servers(salt="same", skill=0.6, loop=0.1, trunc=0.1)
    url_b, log_b = servers(salt="same", skill=0.6, loop=0.1, trunc=0.1)
    out = tmp_path / "out"
    assert _run(data_dir, url_a, url_b, out) == 0
    res = json.loads((out / "result.json").read_text())
    assert res["verdict"]["verdict"] == "no difference beyond noise" and res["complete"]
    allp = res["per_year"]["all"]["paired"]
    assert allp["n"] == 60 and allp["identical_frac"] == 1.0 and allp["accuracy"]["p"] == 1.0
    s = res["per_year"]["all"]["sides"]["stock"]
    assert s["n"] == 60 and s["problems"] == 15 and 0 < s["accuracy"] < 1
    assert s["loop50"] > 0 and s["truncated"] > 0 and s["loop200"] == 0
    assert s["ci_wilson"][0] < s["accuracy"] < s["ci_wilson"][1]
    assert set(res["per_year"]) == {"2024", "2025", "2026", "all"}
    # Same requests on both sides: seeds, sampling parameters, prompts.
    key = lambda r: (r["seed"], r["messages"][0]["content"])  # noqa: E731
    assert sorted(map(key, log_a)) == sorted(map(key, log_b))
    assert {r["temperature"] for r in log_a} == {0.7} and {r["max_tokens"] for r in log_a} == {512}
    assert len({r["seed"] for r in log_a}) == 60
    assert "\\boxed{}" in log_a[0]["messages"][0]["content"]
    gens = [json.loads(ln) for ln in (out / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 60 and all(g["identical"] for g in gens)
    assert {g["stock"]["correct"] for g in gens} == {True, False} and gens[0]["stock"] == gens[0]["replayssm"]
    assert any(g["stock"]["loop50"] and g["stock"]["max_repeats"] >= 50 for g in gens)
    printed = capsys.readouterr().out
    assert "VERDICT" in printed and "no difference beyond noise" in printed
    # Rerun: everything comes from the cache (no new requests).
    n_a = len(log_a)
    assert _run(data_dir, url_a, url_b, out) == 0 and len(log_a) == n_a
    # A different sampling setup is not served from that cache.
    assert _run(data_dir, url_a, url_b, out, "--top-p", "0.9", "--years", "2024") == 0
    assert len(log_a) == n_a + 20


def test_independent_draws_same_skill_no_difference(data_dir, servers, tmp_path):
    url_a, _ = servers(salt="a", skill=0.5)
    url_b, _ = servers(salt="b", skill=0.5)
    assert _run(data_dir, url_a, url_b, tmp_path / "out", n=8) == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    p = res["per_year"]["all"]["paired"]
    assert p["identical_frac"] < 0.5 and p["accuracy"]["p"] > 0.0125


def test_worse_server_differs(data_dir, servers, tmp_path):
    url_a, _ = servers(salt="a", skill=0.9)
    url_b, _ = servers(salt="b", skill=0.2)
    assert _run(data_dir, url_a, url_b, tmp_path / "out") == 1
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert res["verdict"]["verdict"] == "DIFFERS" and res["verdict"]["reasons"][0].startswith("accuracy")
    acc = res["per_year"]["all"]["paired"]["accuracy"]
    assert acc["a_only"] > acc["b_only"] and acc["p"] < 1e-4
    sa, sb = (res["per_year"]["all"]["sides"][k] for k in ("stock", "replayssm"))
    assert sa["accuracy"] > sb["accuracy"] and sa["ci_bootstrap"][0] > sb["ci_bootstrap"][1]
    assert "DIFFERS: accuracy" in (tmp_path / "out" / "report.md").read_text()


def test_looping_server_differs(data_dir, servers, tmp_path):
    url_a, _ = servers(salt="same", skill=0.5)
    url_b, _ = servers(salt="same", skill=0.5, loop=0.5)
    assert _run(data_dir, url_a, url_b, tmp_path / "out") == 1
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert any(r.startswith("loop50") for r in res["verdict"]["reasons"])
    assert res["per_year"]["all"]["sides"]["replayssm"]["loop50"] > 15
    assert res["per_year"]["all"]["sides"]["stock"]["loop50"] == 0


def test_failed_requests_leave_the_run_incomplete(data_dir, servers, tmp_path):
    url_a, _ = servers(salt="same", skill=0.5)
    dead = f"http://127.0.0.1:{ap.e2e.pick_port(0)}"
    assert _run(data_dir, url_a, dead, tmp_path / "out", "--years", "2026", n=1) == 3
    assert "INCOMPLETE" in (tmp_path / "out" / "report.md").read_text()


def test_usage_errors(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        ap.main(["--data-dir", data_dir, "--out", str(tmp_path)])  # no servers
    with pytest.raises(SystemExit):
        ap.main(["--years", "2023", "--export-data", str(tmp_path)])
    assert ap.main(["--data-dir", str(tmp_path / "none"), "--base-url-a", "x", "--base-url-b", "y",
                    "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Launch mode: both servers started by the script (fake sglang.launch_server)
# ----------------------------------------------------------------------------------------------

FAKE_LAUNCHER = FAKE_SERVER_PRELUDE + r'''
import json, os, random, sys, threading, time
args, opt = launch_server_args(sys.argv[1:])
port = int(opt("--port"))
print("[fake] args " + " ".join(args), flush=True)
print(f"[fake] SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS', '')!r}", flush=True)
answers = json.loads(os.environ["FAKE_ANSWERS"])
class H(JsonHandler):
    def do_GET(self):
        self._json(200, {"data": [{"id": "m"}]} if self.path == "/v1/models" else {})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        problem = req["messages"][0]["content"].split("\n\n", 1)[1]
        ok = random.Random(req["seed"]).random() < 0.5
        ans = int(answers[problem]) + (0 if ok else 1)
        self._json(200, {"choices": [{"message": {"content": f"\\boxed{{{ans}}}"}, "finish_reason": "stop"}],
                         "usage": {"completion_tokens": 3}})
serve_until_killed(H, "127.0.0.1", port)
'''


def test_launch_mode(data_dir, tmp_path, monkeypatch):
    py = fake_python(tmp_path, FAKE_LAUNCHER, name="fake_launch.py")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "vocab_size": 10}))
    monkeypatch.setenv("FAKE_ANSWERS", json.dumps(ANSWERS))
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    out = tmp_path / "out"
    rc = ap.main(["--data-dir", data_dir, "--model", str(model), "--python", str(py), "--deterministic",
                  "--out", str(out), "--n", "2", "--quiet", "--bootstrap", "100", "--startup-timeout", "30"])
    assert rc == 0  # the fake answers depend on the seed only: both servers agree
    res = json.loads((out / "result.json").read_text())
    assert res["per_year"]["all"]["paired"]["identical_frac"] == 1.0
    log_a = (out / "server_stock.log").read_text()
    log_b = (out / "server_replayssm.log").read_text()
    assert "--mamba-backend triton" in log_a and "--mamba-backend replayssm" in log_b
    assert "--enable-deterministic-inference" in log_a and "--sampling-backend pytorch" in log_b
    assert f"SGLANG_PLUGINS={ap.e2e.NO_PLUGINS!r}" in log_a and "SGLANG_PLUGINS=''" in log_b
    assert res["servers"]["stock"]["cmd"][:3] == [str(py), "-m", "sglang.launch_server"]
    # Cached: a rerun launches nothing.
    os.unlink(out / "server_stock.log")
    assert ap.main(["--data-dir", data_dir, "--model", str(model), "--python", str(py), "--deterministic",
                    "--out", str(out), "--n", "2", "--quiet", "--bootstrap", "100"]) == 0
    assert not (out / "server_stock.log").exists()
