"""CPU tests of scripts/e2e_parity.py: the pure comparison/log-parsing helpers, and the whole
orchestration (launch, readiness, /generate, process-group shutdown, checks, exit status) against a
fake ``sglang.launch_server`` that speaks the same HTTP API and prints SGLang's log messages."""

import json
import os
import socket
import sys
import time

import pytest

from fake_procs import FAKE_SERVER_PRELUDE, assert_all_stopped, fake_python, python_without_plugin
from script_loader import load_script

e2e = load_script("e2e_parity")


# ----------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------


def test_make_prompts_deterministic_and_in_range():
    a = e2e.make_prompts(0, 32, 5, 2048, 16, 160)
    b = e2e.make_prompts(0, 32, 5, 2048, 16, 160)
    c = e2e.make_prompts(1, 32, 5, 2048, 16, 160)
    assert a == b and a != c
    assert len(a) == 32
    assert all(16 <= len(p) <= 160 for p in a)
    assert all(5 <= t < 2048 for p in a for t in p)
    assert len({len(p) for p in a}) > 5  # lengths vary
    with pytest.raises(ValueError):
        e2e.make_prompts(0, 1, 10, 10, 1, 2)
    with pytest.raises(ValueError):
        e2e.make_prompts(0, 1, 0, 10, 5, 2)


def test_prompt_id_range_uses_tokenizer_and_skips_specials():
    assert e2e.prompt_id_range({"vocab_size": 151936}, 2048) == (5, 2048)
    assert e2e.prompt_id_range({"vocab_size": 1000}, 2048) == (5, 1000)
    assert e2e.prompt_id_range({"vocab_size": 1000}, None) == (5, 1000)


def test_first_divergence():
    assert e2e.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert e2e.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert e2e.first_divergence([5], [6]) == 0
    assert e2e.first_divergence([1, 2, 3], [1, 2]) == 2
    assert e2e.first_divergence([], []) is None


def _out(ids, lps=None):
    return dict(ids=list(ids), logprobs=list(lps) if lps is not None else [-0.5] * len(ids))


def test_compare_outputs_divergence_and_logprobs():
    n = 10
    stock = [_out(range(n), [-0.1 * k for k in range(n)]) for _ in range(4)]
    ours = [
        _out(range(n), [-0.1 * k for k in range(n)]),  # identical
        _out(list(range(6)) + [99, 98, 97, 96], [-0.1 * k + 0.01 for k in range(n)]),  # diverges at 6
        _out(range(n), [-0.1 * k + (0.5 if k == 3 else 0.0) for k in range(n)]),  # logprob bump at 3
        _out([7] + list(range(1, n)), [-0.1 * k + 9.0 for k in range(n)]),  # diverges at 0
    ]
    r = e2e.compare_outputs(stock, ours, min_match=n)
    per = r["per_prompt"]
    assert [p["first_divergence"] for p in per] == [None, 6, None, 0]
    assert [p["matched_tokens"] for p in per] == [n, 6, n, 0]
    assert [p["passed"] for p in per] == [True, False, True, False]
    assert r["num_passed"] == 2 and r["pass_frac"] == 0.5
    # Logprob diffs only over the common prefix: prompt 1 -> 6 diffs of 0.01; prompt 3 -> none.
    assert per[1]["logprob_max_abs_diff"] == pytest.approx(0.01)
    assert per[3]["logprob_max_abs_diff"] is None
    assert per[2]["logprob_max_abs_diff"] == pytest.approx(0.5)
    assert r["logprob_max_abs_diff"] == pytest.approx(0.5)
    total = 0.5 + 6 * 0.01
    assert r["logprob_mean_abs_diff"] == pytest.approx(total / (n + 6 + n))
    # A lower bar: 6 identical tokens are enough.
    assert e2e.compare_outputs(stock, ours, min_match=6)["num_passed"] == 3
    with pytest.raises(ValueError):
        e2e.compare_outputs(stock, ours[:2], min_match=n)


def test_spread_new_tokens_and_per_prompt_lengths():
    lens = e2e.spread_new_tokens(0, 64, 256, 0.5)
    assert len(lens) == 64 and min(lens) >= 128 and max(lens) <= 256
    assert len(set(lens)) > 16  # requests finish at many different steps
    assert lens == e2e.spread_new_tokens(0, 64, 256, 0.5)  # seeded
    assert e2e.spread_new_tokens(0, 4, 256, 0.0) == [256] * 4
    with pytest.raises(ValueError):
        e2e.spread_new_tokens(0, 4, 256, 1.0)
    payload = e2e.generate_payload([[1, 2], [3]], [5, 9])
    assert [p["max_new_tokens"] for p in payload["sampling_params"]] == [5, 9]
    assert e2e.generate_payload([[1, 2], [3]], 7)["sampling_params"]["max_new_tokens"] == 7
    with pytest.raises(ValueError):
        e2e.generate_payload([[1, 2], [3]], [5])
    # A prompt asked for 4 tokens passes with 4 identical ones; one asked for 10 needs all 10 (a
    # server that stops early fails it).
    stock = [_out(range(4), [0.0] * 4), _out(range(10), [0.0] * 10), _out(range(10), [0.0] * 10)]
    ours = [_out(range(4), [0.0] * 4), _out(range(10), [0.0] * 10), _out(range(6), [0.0] * 6)]
    r = e2e.compare_outputs(stock, ours, min_match=10, expected=[4, 10, 10])
    assert [p["passed"] for p in r["per_prompt"]] == [True, True, False]
    assert e2e.compare_outputs(stock, ours, min_match=10)["num_passed"] == 1


def test_parse_generate_response():
    resp = [
        {"text": "x", "output_ids": [7, 8], "meta_info": {
            "output_token_logprobs": [[-0.25, 7, None], [-1.5, 8, None]], "completion_tokens": 2,
            "spec_accept_length": 1.5, "spec_verify_ct": 2, "finish_reason": {"type": "length", "length": 2}}},
        {"text": "y", "meta_info": {"output_token_logprobs": [[-0.5, 3, "a"]], "completion_tokens": 1}},
    ]
    out = e2e.parse_generate_response(resp)
    assert out[0]["ids"] == [7, 8] and out[0]["logprobs"] == [-0.25, -1.5]
    assert out[0]["spec_accept_length"] == 1.5 and out[1]["spec_accept_length"] is None
    assert out[1]["ids"] == [3]
    single = e2e.parse_generate_response(resp[1])
    assert len(single) == 1 and single[0]["ids"] == [3]
    bad = [{"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-0.1, 1, None], [-0.1, 3, None]]}}]
    with pytest.raises(ValueError):
        e2e.parse_generate_response(bad)


LOG_NOSPEC = """\
[2026-11-30 10:00:00] server_args=ServerArgs(model_path='/m', disable_cuda_graph=False, disable_prefill_cuda_graph=True)
[2026-11-30 10:00:05] Mamba Cache is allocated. max_mamba_cache_size: 100, conv_state size: 0.01GB, ssm_state size: 0.02GB
[2026-11-30 10:00:06] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=120.00 GB
[2026-11-30 10:00:09] Capture target decode CUDA graph end. elapsed=3.00 s, mem usage=0.10 GB, avail mem=119.90 GB.
[2026-11-30 10:00:10] The server is fired up and ready to roll!
"""

LOG_SPEC = """\
[2026-11-30 10:00:05] Mamba Cache is allocated. max_mamba_cache_size: 100, conv_state size: 0.01GB, ssm_state size: 0.02GB intermediate_ssm_state_cache size: 0.12GB intermediate_conv_window_cache size: 0.00GB
[2026-11-30 10:00:06] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2], avail mem=120.00 GB
[2026-11-30 10:00:09] Capture target verify CUDA graph end. elapsed=3.00 s, mem usage=0.10 GB, avail mem=119.90 GB.
[2026-11-30 10:00:09] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2], avail mem=119.90 GB
[2026-11-30 10:00:10] Capture draft decode CUDA graph end. elapsed=1.00 s, mem usage=0.01 GB, avail mem=119.89 GB.
"""


def test_cuda_graph_parsing():
    p = e2e.parse_cuda_graph_log(LOG_NOSPEC)
    assert p["captures"] == {"target decode": ["begin", "end"]}
    assert p["disabled_notices"] == []
    assert e2e.cuda_graph_check(p, spec=False)[0]
    assert not e2e.cuda_graph_check(p, spec=True)[0]  # a spec server must capture verify
    q = e2e.parse_cuda_graph_log(LOG_SPEC)
    assert q["captures"]["target verify"] == ["begin", "end"] and "draft decode" in q["captures"]
    assert e2e.cuda_graph_check(q, spec=True)[0]
    # Begin without end (capture crashed) fails.
    half = LOG_NOSPEC.replace("Capture target decode CUDA graph end", "Something else")
    assert not e2e.cuda_graph_check(e2e.parse_cuda_graph_log(half), spec=False)[0]
    # Disabled notices fail even with a capture line.
    for notice in ("server_args=ServerArgs(disable_cuda_graph=True)",
                   "WARNING Cuda graph is disabled because of using torch native attention backend"):
        ok, detail = e2e.cuda_graph_check(e2e.parse_cuda_graph_log(LOG_NOSPEC + notice + "\n"), spec=False)
        assert not ok and "disabled" in detail
    assert not e2e.cuda_graph_check(e2e.parse_cuda_graph_log(""), spec=False)[0]


def test_intermediate_ssm_report_and_problems():
    r = e2e.intermediate_ssm_report(LOG_SPEC)
    assert r["mentions"] == 1 and r["sizes_gb"] == [0.12]
    assert e2e.intermediate_ssm_report(LOG_NOSPEC)["mentions"] == 0
    assert r["allocated"] == 1
    zero = LOG_SPEC.replace("0.12GB intermediate_conv", "0.00GB intermediate_conv")
    z = e2e.intermediate_ssm_report(zero)
    assert z["mentions"] == 1 and z["allocated"] == 0 and z["sizes_gb"] == [0.0]
    assert e2e.intermediate_ssm_report(zero + "using intermediate_ssm buffer\n")["allocated"] == 1
    good = dict(served=True, log=LOG_SPEC)
    for mode, ok in (("strict", False), ("allocated", True)):
        checks = e2e.evaluate(spec=True, sides={"stock": good, "ours": dict(served=True, log=zero)},
                              comparison=None, min_pass_frac=0.95, issm_check=mode)
        assert [c["ok"] for c in checks if c["name"] == "ours: no intermediate_ssm"] == [ok]
    log = "ok\nWARNING Parameter model.layers.9.foo not found in params_dict\nTraceback (most recent call last):\nfine\n"
    probs = e2e.problem_lines(log)
    assert len(probs) == 2 and "not found" in probs[0]


def test_build_server_cmd():
    cmd = e2e.build_server_cmd(python="py", model="/m", port=1234, mamba_backend="replayssm",
                               attention_backend="flashinfer", moe_runner_backend="triton", spec=True,
                               disable_prefill_cuda_graph=True, cuda_graph_max_bs=32,
                               extra_args=["--foo", "1"])
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"]
    s = " ".join(cmd)
    assert "--mamba-backend replayssm" in s and "--attention-backend flashinfer" in s
    assert "--speculative-algorithm NEXTN" in s and "--speculative-draft-model-path /m" in s
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in s
    assert "--disable-prefill-cuda-graph" in s and "--cuda-graph-max-bs-decode 32" in s
    assert "--sampling-backend pytorch" in s and "--moe-runner-backend triton" in s
    assert cmd[-2:] == ["--foo", "1"]
    plain = " ".join(e2e.build_server_cmd(python="py", model="/m", port=1, mamba_backend="triton",
                                          attention_backend="triton"))
    assert "speculative" not in plain and "prefill" not in plain and "moe-runner" not in plain


def _cmp(passed, total, min_match=256):
    per = [dict(prompt=i, first_divergence=None if i < passed else 3, passed=i < passed) for i in range(total)]
    return dict(per_prompt=per, num_prompts=total, num_passed=passed, pass_frac=passed / total,
                logprob_max_abs_diff=0.01, logprob_mean_abs_diff=0.001, min_match=min_match)


def test_evaluate_checks():
    good = dict(served=True, log=LOG_SPEC)
    ours = dict(served=True, log=LOG_SPEC.replace(
        " intermediate_ssm_state_cache size: 0.12GB", ""))
    checks = e2e.evaluate(spec=True, sides={"stock": good, "ours": ours}, comparison=_cmp(31, 32), min_pass_frac=0.95)
    assert all(c["ok"] for c in checks), checks
    # 30/32 < 95%.
    checks = e2e.evaluate(spec=True, sides={"stock": good, "ours": ours}, comparison=_cmp(30, 32), min_pass_frac=0.95)
    assert [c["name"] for c in checks if not c["ok"]] == ["token parity"]
    # Ours mentions intermediate_ssm.
    checks = e2e.evaluate(spec=True, sides={"stock": good, "ours": good}, comparison=_cmp(32, 32), min_pass_frac=0.95)
    assert [c["name"] for c in checks if not c["ok"]] == ["ours: no intermediate_ssm"]
    # Ours did not serve and has no log: served, graphs and the log check fail.
    checks = e2e.evaluate(spec=True, sides={"stock": good, "ours": dict(served=False, error="boom", log="")},
                          comparison=None, min_pass_frac=0.95)
    assert {c["name"] for c in checks if not c["ok"]} == {"ours: served", "ours: CUDA graphs",
                                                          "ours: no intermediate_ssm"}
    # Optional logprob limit.
    checks = e2e.evaluate(spec=True, sides={"stock": good, "ours": ours}, comparison=_cmp(32, 32),
                          min_pass_frac=0.95, max_logprob_diff=0.001)
    assert [c["name"] for c in checks if not c["ok"]] == ["logprob parity"]


def test_pick_port():
    p = e2e.pick_port(0)
    assert e2e.port_is_free(p)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        busy = s.getsockname()[1]
        assert not e2e.port_is_free(busy)
        assert e2e.pick_port(busy) > busy


# ----------------------------------------------------------------------------------------------
# Whole script against a fake server
# ----------------------------------------------------------------------------------------------

FAKE_SERVER = FAKE_SERVER_PRELUDE + r'''
import json, os, subprocess, sys, threading, time

args, opt = launch_server_args(sys.argv[1:])
port, host = int(opt("--port")), opt("--host", "127.0.0.1")
backend = opt("--mamba-backend")
spec = "--speculative-algorithm" in args
ours = backend == "replayssm"
env = os.environ

def log(msg):
    print(f"[fake] {msg}", flush=True)

log(f"server_args=ServerArgs(model_path={opt('--model-path')!r}, mamba_backend={backend!r}, disable_cuda_graph=False)")
log(f"SGLANG_PLUGINS={env.get('SGLANG_PLUGINS', '')!r}")
if ours and env.get("FAKE_OURS_FAIL"):
    print("launch_server: error: argument --mamba-backend: invalid choice: 'replayssm'", flush=True)
    sys.exit(2)
# A "scheduler" child in the same process group: the parity script must stop it too.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(env["FAKE_PIDFILE"], "a") as f:
    f.write(f"{os.getpid()} {child.pid}\n")
issm = spec and (not ours or env.get("FAKE_OURS_ISSM"))
log("Mamba Cache is allocated. max_mamba_cache_size: 64, conv_state size: 0.01GB, ssm_state size: 0.02GB"
    + (" intermediate_ssm_state_cache size: 0.12GB intermediate_conv_window_cache size: 0.00GB" if issm else ""))
if not env.get("FAKE_NO_GRAPH"):
    phase = "verify" if spec else "decode"
    log(f"Capture target {phase} CUDA graph begin. backend=full, bs=[1, 2, 4], avail mem=100.00 GB")
    log(f"Capture target {phase} CUDA graph end. elapsed=0.10 s, mem usage=0.01 GB, avail mem=99.99 GB.")

SEEN = []
diverge = {}
if ours:
    for item in filter(None, env.get("FAKE_DIVERGE", "").split(",")):
        i, pos = item.split(":")
        diverge[int(i)] = int(pos)

def continuation(i, prompt, n):
    t, out = prompt[-1], []
    for k in range(n):
        t = (t * 31 + 7) % 2048
        if diverge.get(i) == k:
            t = (t + 1) % 2048
        lp = -0.1 - 0.01 * (k % 7) + (1e-4 if ours else 0.0)
        out.append([lp, t, None])
    return out

class H(JsonHandler):
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        sp = req["sampling_params"]
        assert sp["temperature"] == 0 and sp["ignore_eos"] is True and req["return_logprob"] is True
        res = []
        # A radix cache stand-in: prompt tokens shared with an earlier request's prompt + output.
        hits = 0
        for p in req["input_ids"]:
            best = max((next((j for j, (x, y) in enumerate(zip(p, q)) if x != y), min(len(p), len(q)))
                        for q in SEEN), default=0)
            hits += best if not (ours and env.get("FAKE_OURS_NO_RADIX")) else 0
        log(f"Prefill batch, #new-seq: {len(req['input_ids'])}, #new-token: 1, #cached-token: {hits}, "
            f"full token usage: 0.00")
        if int(opt("--max-total-tokens", "100000")) < 8000 and not (ours and env.get("FAKE_OURS_NO_RETRACT")):
            log("KV cache pool is full. Retract requests. #retracted_reqs: 1")
        for i, p in enumerate(req["input_ids"]):
            lps = continuation(i, p, sp["max_new_tokens"])
            SEEN.append(list(p) + [t for _, t, _ in lps])
            meta = {"output_token_logprobs": lps, "completion_tokens": len(lps)}
            if spec:
                meta.update(spec_accept_length=2.5, spec_verify_ct=len(lps) // 2)
            res.append({"text": "", "output_ids": [t for _, t, _ in lps], "meta_info": meta})
        self._json(200, res)

serve_until_killed(H, host, port, float(env.get("FAKE_STOCK_STARTUP_S") if not ours and env.get("FAKE_STOCK_STARTUP_S")
                                       else env.get("FAKE_STARTUP_S", "0.2")), log)
'''


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    py = fake_python(tmp_path, FAKE_SERVER)
    pidfile = tmp_path / "pids.txt"
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    model = tmp_path / "tinymodel"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 2048}))
    for k in ("FAKE_OURS_FAIL", "FAKE_OURS_ISSM", "FAKE_NO_GRAPH", "FAKE_DIVERGE", "SGLANG_PLUGINS",
              "FAKE_OURS_NO_RADIX", "FAKE_OURS_NO_RETRACT", "FAKE_STOCK_STARTUP_S"):
        monkeypatch.delenv(k, raising=False)
    return dict(py=py, model=str(model), pidfile=pidfile, out=tmp_path / "out")


def _run(fake, *extra, n=32, tokens=40):
    argv = ["--model", fake["model"], "--python", fake["py"], "--out", str(fake["out"]),
            "--num-prompts", str(n), "--max-new-tokens", str(tokens), "--startup-timeout", "60",
            "--prompt-len", "4", "12", *extra]
    rc = e2e.main(argv)
    res = json.loads((fake["out"] / "result.json").read_text())
    return rc, res


def test_script_pass_spec(fake, capsys):
    rc, res = _run(fake, "--spec")
    assert rc == 0, res["checks"]
    assert res["ok"] and res["comparison"]["num_passed"] == 32
    assert res["attention_backend"] == "flashinfer" and res["moe_runner_backend"] == "triton"
    assert res["sides"]["stock"]["intermediate_ssm"]["mentions"] == 1
    assert res["sides"]["ours"]["intermediate_ssm"]["mentions"] == 0
    assert res["sides"]["stock"]["accept"]["mean"] == 2.5
    assert res["comparison"]["logprob_max_abs_diff"] == pytest.approx(1e-4, abs=1e-9)
    assert "--mamba-backend replayssm" in " ".join(res["sides"]["ours"]["cmd"])
    assert "--mamba-backend triton" in " ".join(res["sides"]["stock"]["cmd"])
    assert (fake["out"] / "stock.log").exists() and (fake["out"] / "ours_outputs.json").exists()
    # The stock baseline runs without SGLang plugins (ours included); ours keeps them.
    assert f"SGLANG_PLUGINS={e2e.NO_PLUGINS!r}" in (fake["out"] / "stock.log").read_text()
    assert "SGLANG_PLUGINS=''" in (fake["out"] / "ours.log").read_text()
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("RESULT: PASS")
    assert_all_stopped(fake["pidfile"])


def test_script_divergence_threshold(fake, monkeypatch):
    monkeypatch.setenv("FAKE_DIVERGE", "3:10")
    rc, res = _run(fake)  # 31/32 = 96.9% >= 95%
    assert rc == 0
    per = res["comparison"]["per_prompt"]
    assert per[3]["first_divergence"] == 10 and per[3]["passed"] is False
    assert [p["prompt"] for p in per if p["first_divergence"] is not None] == [3]
    monkeypatch.setenv("FAKE_DIVERGE", "3:10,17:39")
    rc, res = _run(fake)  # 30/32 < 95%
    assert rc == 1
    failed = [c["name"] for c in res["checks"] if not c["ok"]]
    assert failed == ["token parity"]
    # With a 20-token bar the late divergence (39) passes again.
    rc, res = _run(fake, "--min-match", "20")
    assert rc == 0 and res["comparison"]["num_passed"] == 31


def test_script_ours_failures(fake, monkeypatch):
    monkeypatch.setenv("FAKE_OURS_ISSM", "1")
    rc, res = _run(fake, "--spec", n=4, tokens=8)
    assert rc == 1 and [c["name"] for c in res["checks"] if not c["ok"]] == ["ours: no intermediate_ssm"]
    monkeypatch.delenv("FAKE_OURS_ISSM")
    monkeypatch.setenv("FAKE_OURS_FAIL", "1")
    t0 = time.time()
    rc, res = _run(fake, n=4, tokens=8)
    assert rc == 1 and time.time() - t0 < 30
    assert res["sides"]["ours"]["served"] is False and "exited" in res["sides"]["ours"]["error"]
    assert res["sides"]["stock"]["served"] is True
    assert any("invalid choice" in line for line in res["sides"]["ours"]["problems"])
    # Stock only: the script logic can be checked without our backend.
    rc, res = _run(fake, "--only", "stock", n=4, tokens=8)
    assert rc == 0 and list(res["sides"]) == ["stock"] and res["comparison"] is None
    assert_all_stopped(fake["pidfile"])


def test_script_no_cuda_graph_fails(fake, monkeypatch):
    monkeypatch.setenv("FAKE_NO_GRAPH", "1")
    rc, res = _run(fake, "--only", "stock", n=2, tokens=4)
    assert rc == 1
    assert [c["name"] for c in res["checks"] if not c["ok"]] == ["stock: CUDA graphs"]


def test_script_startup_timeout(fake, monkeypatch):
    monkeypatch.setenv("FAKE_STARTUP_S", "30")
    t0 = time.time()
    rc = e2e.main(["--model", fake["model"], "--python", fake["py"], "--out", str(fake["out"]),
                   "--only", "stock", "--num-prompts", "2", "--max-new-tokens", "4", "--startup-timeout", "2"])
    assert rc == 1 and time.time() - t0 < 25
    res = json.loads((fake["out"] / "result.json").read_text())
    assert "not ready" in res["sides"]["stock"]["error"]
    # The overall time budget cuts the wait short too and still writes result.json.
    t0 = time.time()
    rc = e2e.main(["--model", fake["model"], "--python", fake["py"], "--out", str(fake["out"]),
                   "--num-prompts", "2", "--max-new-tokens", "4", "--startup-timeout", "100", "--time-budget", "23"])
    assert rc == 1 and time.time() - t0 < 25
    res = json.loads((fake["out"] / "result.json").read_text())
    assert "budget" in res["sides"]["stock"]["error"] and "budget" in res["sides"]["ours"]["error"]
    assert_all_stopped(fake["pidfile"])


def test_table_format():
    result = dict(model="/m", spec=True, sides={"stock": dict(served=True, startup_s=61.0, generate_s=2.0,
                                                               output_tokens=8192, accept=dict(mean=3.2),
                                                               intermediate_ssm=dict(mentions=1),
                                                               cuda_graph=dict(captures={"target verify": ["end"]}))},
                  comparison=_cmp(31, 32), checks=[dict(name="x", ok=False, detail="d")], ok=False)
    table = e2e.format_table(result)
    assert "first divergence (prompt:pos): 31:3" in table
    assert "[FAIL] x: d" in table and table.endswith("RESULT: FAIL")
    assert "4096" in table  # tok/s


def test_radix_wave2_prompts():
    prompts = [[5] * 40, [6] * 200, [7] * 300]
    outputs = [[1] * 256, [2] * 256, [3] * 256]
    w = e2e.radix_wave2(prompts, outputs, seed=0, vocab_lo=10, vocab_hi=20)
    assert len(w) == 9
    for g, (p, o) in enumerate(zip(prompts, outputs)):
        a, b, c = w[3 * g: 3 * g + 3]
        k = max(0, min(len(o), 256 + 24 - len(p)))
        assert a[: len(p) + k] == p + o[:k] and len(a) == len(p) + k + 16  # crosses 256 by 24 (if it can)
        assert b[: len(p)] == p and len(b) == len(p) + 24 and all(10 <= t < 20 for t in b[len(p):])
        assert c == p
    assert len(w[0]) == 256 + 24 + 16 and len(w[6]) == 300 + 16  # prompt already past the boundary
    assert w == e2e.radix_wave2(prompts, outputs, seed=0, vocab_lo=10, vocab_hi=20)  # deterministic


def test_cached_tokens_from_sglang_log_lines():
    log = ("[2026-11-30 22:29:03] Prefill batch, #new-seq: 1, #new-token: 15, #cached-token: 0, full token usage: 0.00\n"
           "[2026-11-30 22:29:04] Prefill batch, #new-seq: 3, #new-token: 40, #cached-token: 257, full token usage: 0.01\n"
           "[2026-11-30 22:29:04] Decode batch, #running-req: 3, #token: 900, #cached-token: 999\n"
           "[2026-11-30 22:29:05] Prefill batch, #new-seq: 1, #new-token: 4, #cached-token: 12, full token usage: 0.01\n")
    assert e2e.cached_tokens(log) == 269


def test_script_radix_waves_and_retraction(fake):
    rc, res = _run(fake, "--radix-waves", "--extra-args=--max-total-tokens 6000", "--expect-retract", n=8)
    assert rc == 0, res["checks"]
    assert res["comparison"]["num_prompts"] == 8 + 3 * 8 and res["workload"]["compared_prompts"] == 32
    for side in ("stock", "ours"):
        assert res["sides"][side]["cached_tokens_later_waves"] > 8 * 40  # the repeats alone hit their prompts
        assert res["sides"][side]["repeats_identical"] == "8/8"
        assert res["sides"][side]["retractions"] == 2  # one log line per wave
    names = {c["name"]: c["ok"] for c in res["checks"]}
    assert names["ours: radix hits"] and names["stock: retraction"] and names["ours: retraction"]
    assert_all_stopped(fake["pidfile"])


def test_radix_cache_args_for_unresolved_archs():
    # Text-only Qwen3.5: SGLang 0.5.17 leaves the strategy unresolved (tests/test_tiny_qwen3_5.py).
    assert e2e.model_kind({"architectures": ["Qwen3_5ForCausalLM"]}) == "qwen3_5_text"
    assert e2e.model_kind({"architectures": ["Qwen3_5MoeForCausalLM"]}) == "qwen3_5_moe_text"
    for kind in ("qwen3_5_text", "qwen3_5_moe_text"):
        assert e2e.radix_cache_args(kind, [], False) == ["--disable-radix-cache"]
        assert e2e.radix_cache_args(kind, ["--max-total-tokens", "6000"], True) == [
            "--mamba-radix-cache-strategy", "extra_buffer"]
        for chosen in (["--disable-radix-cache"], ["--mamba-radix-cache-strategy", "no_buffer"],
                       ["--mamba-radix-cache-strategy=no_buffer", "--disable-overlap-schedule"]):
            assert e2e.radix_cache_args(kind, chosen, False) == e2e.radix_cache_args(kind, chosen, True) == []
    for kind in ("qwen3_next", "nemotron_h", "qwen3_5"):  # resolved by SGLang (qwen3_5: the VLM config)
        assert e2e.radix_cache_args(kind, [], True) == e2e.radix_cache_args(kind, [], False) == []


def test_script_qwen3_5_text_radix_flags_reach_both_servers(fake):
    cfg = {"model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 2048}
    with open(fake["model"] + "/config.json", "w") as f:
        json.dump(cfg, f)
    rc, res = _run(fake, "--spec", n=4)
    assert rc == 0, res["checks"]
    assert res["kind"] == "qwen3_5_text" and res["attention_backend"] == "triton"
    assert res["radix_cache_args"] == ["--disable-radix-cache"]
    for side in ("stock", "ours"):
        assert res["sides"][side]["cmd"].count("--disable-radix-cache") == 1, side
    rc, res = _run(fake, "--radix-waves", n=4)
    assert rc == 0, res["checks"]
    for side in ("stock", "ours"):
        cmd = " ".join(res["sides"][side]["cmd"])
        assert "--mamba-radix-cache-strategy extra_buffer" in cmd and "--disable-radix-cache" not in cmd, side
    assert_all_stopped(fake["pidfile"])


def test_script_radix_and_retraction_checks_fail(fake, monkeypatch):
    monkeypatch.setenv("FAKE_OURS_NO_RADIX", "1")
    monkeypatch.setenv("FAKE_OURS_NO_RETRACT", "1")
    rc, res = _run(fake, "--radix-waves", "--extra-args=--max-total-tokens 6000", "--expect-retract", n=4)
    assert rc == 1
    names = {c["name"]: c["ok"] for c in res["checks"]}
    assert names["stock: radix hits"] and not names["ours: radix hits"]
    assert names["stock: retraction"] and not names["ours: retraction"]
    # without the flags the same run passes: the checks are what failed it
    rc, res = _run(fake, n=4)
    assert rc == 0 and not any("radix" in c["name"] or "retraction" in c["name"] for c in res["checks"])
    assert_all_stopped(fake["pidfile"])


def test_side_startup_timeout_keeps_the_later_sides_reserve():
    # No budget: the cap. With a budget: what is left after 20 s to stop and a reserve per later side.
    assert e2e.side_startup_timeout(330.0, None, 0.0, 1, 130.0) == 330.0
    assert e2e.side_startup_timeout(330.0, 357.0, 0.0, 1, 130.0) == 207.0  # the first side of a case
    assert e2e.side_startup_timeout(330.0, 357.0, 150.0, 0, 130.0) == 187.0  # the last side gets the rest
    assert e2e.side_startup_timeout(100.0, 1000.0, 0.0, 1, 130.0) == 100.0  # the cap still holds
    assert e2e.side_startup_timeout(330.0, 100.0, 0.0, 1, 130.0) == 1.0  # nothing left: fail at once


def test_script_a_hung_first_server_leaves_the_later_side_its_reserve(fake, monkeypatch):
    """With a time budget, the first server's startup wait stops where the later side's reserve
    begins: stock never getting ready must not take our server's time too."""
    monkeypatch.setenv("FAKE_STOCK_STARTUP_S", "60")
    rc = e2e.main(["--model", fake["model"], "--python", fake["py"], "--out", str(fake["out"]),
                   "--num-prompts", "2", "--max-new-tokens", "4", "--prompt-len", "4", "12",
                   "--startup-timeout", "300", "--time-budget", "32", "--later-side-reserve", "8"])
    res = json.loads((fake["out"] / "result.json").read_text())
    assert rc == 1 and not res["sides"]["stock"]["served"]
    assert "kept for each later side" in res["sides"]["stock"]["error"], res["sides"]["stock"]["error"]
    assert res["sides"]["ours"]["served"], res["sides"]["ours"]
    assert_all_stopped(fake["pidfile"])


def test_plugin_preflight(tmp_path, monkeypatch):
    """The interpreter the servers run on must see our plugin's entry point (the test suite runs
    from an install of this checkout); an interpreter without it, or SGLANG_PLUGINS leaving it
    out, gets a message naming the flag and the fix."""
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    env = dict(os.environ)
    assert e2e.plugin_preflight(sys.executable, env) is None
    assert e2e.plugin_preflight(sys.executable, {**env, "SGLANG_PLUGINS": "replayssm"}) is None
    msg = e2e.plugin_preflight(sys.executable, {**env, "SGLANG_PLUGINS": "other_plugin"})
    assert msg and "SGLANG_PLUGINS='other_plugin'" in msg and "replayssm" in msg
    msg = e2e.plugin_preflight(python_without_plugin(tmp_path), env)
    assert msg and "--mamba-backend replayssm" in msg and "pip install -e" in msg
    msg = e2e.plugin_preflight(str(tmp_path / "no_such_python"), env)
    assert msg and "could not ask" in msg


def test_script_stops_before_any_server_without_the_plugin(fake, tmp_path, capsys):
    py = python_without_plugin(tmp_path, tmp_path / "fake_server.py")
    rc = e2e.main(["--model", fake["model"], "--python", py, "--out", str(fake["out"]), "--num-prompts", "2"])
    assert rc == 2
    assert "ours side: --mamba-backend replayssm needs the sglang-replayssm plugin" in capsys.readouterr().err
    assert not fake["pidfile"].exists()  # no server was started, stock's included
