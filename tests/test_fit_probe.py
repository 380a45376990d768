"""CPU tests of scripts/fit_probe.py: the memory split and prediction on the H200 logs of session
10, and the whole probe (calibrate, predict, launch at N*, load, bounds) against a fake
`sglang.launch_server` whose pools follow SGLang's radix-off sizing: the mamba pool holds
--max-running-requests slots (plus `intermediate_ssm` on the stock side) and the KV cache gets the
rest of a fixed budget."""

import json
import math

import pytest

from fake_procs import FAKE_SERVER_PRELUDE, assert_all_stopped, fake_python
from script_loader import load_script

fp = load_script("fit_probe")
bs = load_script("bench_serving")

# Two lines each from the session-10 H200 logs (spec, radix off, N=48; docs/data/session10_2026-12-01).
STOCK_LOG = """\
[2026-12-01 01:23:03] Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.03GB, ssm_state size: 1.15GB intermediate_ssm_state_cache size: 4.59GB intermediate_conv_window_cache size: 0.05GB 
[2026-12-01 01:23:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 12081030, K size: 46.09 GB, V size: 46.09 GB
[2026-12-01 01:23:03] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 12081030, K size: 11.52 GB, V size: 11.52 GB
[2026-12-01 01:23:14] max_total_num_tokens=12081030, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=32768, available_gpu_mem=12.55 GB
"""
OURS_LOG = """\
[2026-12-01 01:24:38] Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.03GB, ssm_state size: 1.15GB 
[2026-12-01 01:24:38] ReplaySSM pool (gdn, 12 SSM layers, ring_len=16, rings in bfloat16): per slot checkpoint 24.00 MiB + rings 5.30 MiB + cursors 8 B; 49 slots: checkpoints 1.148 GiB, rings 0.253 GiB; speculative: no per-draft state snapshots (the rings replace them), conv windows 0.054 GiB
[2026-12-01 01:24:38] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 12547431, K size: 47.86 GB, V size: 47.86 GB
[2026-12-01 01:24:38] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 12547431, K size: 11.97 GB, V size: 11.97 GB
[2026-12-01 01:24:49] max_total_num_tokens=12547431, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=32768, available_gpu_mem=12.55 GB
"""


def test_split_and_prediction_from_the_h200_logs():
    tpr = 512 + 256 + 4
    s = fp.memory_split(bs.parse_server_facts(STOCK_LOG))
    o = fp.memory_split(bs.parse_server_facts(OURS_LOG))
    assert s["parts_gb"]["intermediate_ssm"] == 4.59 and "replayssm_rings" not in s["parts_gb"]
    assert o["parts_gb"]["replayssm_rings"] == 0.253 and o["parts_gb"]["replayssm_conv_windows"] == 0.054
    assert o["parts_gb"]["intermediate_ssm"] == 0.0
    assert s["kv_gb"] == pytest.approx(2 * 46.09 + 2 * 11.52)
    ps, po = fp.predict_fit(s, tpr), fp.predict_fit(o, tpr)
    # (N + 1) * slot + N * tpr * kv fills the same budget the N=48 launch used
    for split, p in ((s, ps), (o, po)):
        used = (p["n"] + 1) * p["slot_gib"] + p["n"] * tpr * split["kv_gb_per_token"]
        more = (p["n"] + 2) * p["slot_gib"] + (p["n"] + 1) * tpr * split["kv_gb_per_token"]
        assert used <= p["budget_gib"] < more
    assert ps["n"] == 958 and po["n"] == 3211  # docs/serving.md quotes these
    assert ps["slot_mib"] == pytest.approx(121.6, abs=0.1) and po["slot_mib"] == pytest.approx(31.1, abs=0.1)
    f = fp.launch_fit(bs.parse_server_facts(OURS_LOG), 48, tpr)
    assert f == dict(max_running_requests=48, kv_tokens=12547431, by_kv=12547431 // tpr, fit=48,
                     upper=12547431 // tpr)


def test_upstream_rings_count_as_slot_bytes():
    log = ("Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.03GB, ssm_state size: 1.15GB \n"
           "GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): d=0.100GB, k=0.050GB, g=0.001GB "
           "rawv=0.100GB, rawk=0.050GB, beta=0.001GB \n"
           "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB\n")
    split = fp.memory_split(bs.parse_server_facts(log))
    assert split["parts_gb"]["upstream_rings"] == pytest.approx(0.302)
    assert split["mamba_gb"] == pytest.approx(1.15 + 0.03 + 0.302)
    done = {"load": {"failed": 0}, "reached": 1}
    r = fp.ratio_summary({"upstream": {"fit": {"fit": 100}, **done}, "ours": {"fit": {"fit": 150}, **done}})
    assert r == {"fit_ratio_vs_upstream": 1.5}


FAKE = FAKE_SERVER_PRELUDE + r'''
import json, os, sys, threading, time

args, opt = launch_server_args(sys.argv[1:])
assert "--disable-radix-cache" in args and "--speculative-algorithm" in args
port, host = int(opt("--port")), opt("--host", "127.0.0.1")
side = "ours" if opt("--mamba-backend") == "replayssm" else "stock"
env = os.environ
with open(env["FAKE_PIDFILE"], "a") as f:
    f.write(f"{os.getpid()}\n")
def log(msg):
    print(f"[fake] {msg}", flush=True)
n = int(opt("--max-running-requests"))
mf = float(opt("--mem-fraction-static", "0.907"))
log(f"server_args=ServerArgs(model_path='x', mem_fraction_static={mf}, max_running_requests={n})")
B, KV = float(env["FAKE_BUDGET_GB"]), float(env["FAKE_KV_GB_PER_TOKEN"])
state, conv = 0.02, 0.001                     # GB per slot, both sides
extra = 0.08 if side == "stock" else 0.005    # intermediate_ssm / rings per slot
slots = n + 1
mamba = slots * (state + conv + extra)
if n > int(env.get("FAKE_FAIL_ABOVE", "1000000000")) or mamba >= B:
    log("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache.")
    sys.exit(1)
tokens = int((B - mamba) / KV)
if side == "stock":
    log(f"Mamba Cache is allocated. max_mamba_cache_size: {n}, conv_state size: {slots * conv:.4f}GB, ssm_state size: {slots * state:.4f}GB intermediate_ssm_state_cache size: {slots * extra:.4f}GB intermediate_conv_window_cache size: 0.00GB ")
else:
    log(f"Mamba Cache is allocated. max_mamba_cache_size: {n}, conv_state size: {slots * conv:.4f}GB, ssm_state size: {slots * state:.4f}GB ")
    log(f"ReplaySSM pool (gdn, 12 SSM layers, ring_len=16, rings in bfloat16): per slot checkpoint 20.00 MiB + rings 5.00 MiB + cursors 8 B; {slots} slots: checkpoints {slots * state:.4f} GiB, rings {slots * extra:.4f} GiB; speculative: no per-draft state snapshots (the rings replace them), conv windows 0.000 GiB")
log(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: {tokens * KV / 2:.6f} GB, V size: {tokens * KV / 2:.6f} GB")
log(f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests={n}, context_len=32768, available_gpu_mem=10.00 GB")
cap = int(env.get("FAKE_ADMIT_CAP", "1000000000"))
running = [0]
lock = threading.Lock()
def reporter():
    while True:
        time.sleep(0.02)
        with lock:
            r = min(running[0], cap)
        if r:
            log(f"Decode batch, #running-req: {r}, #full token: 10, full token usage: 0.00, mamba num: {r}, mamba usage: 0.00, accept len: 3.00, accept rate: 0.67, cuda graph: False, gen throughput (token/s): 100.00, #queue-req: 0")
threading.Thread(target=reporter, daemon=True).start()

class H(JsonHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        sp = req["sampling_params"]
        assert sp["temperature"] == 0 and sp["ignore_eos"] is True and not req.get("stream")
        ids = req["input_ids"]
        assert isinstance(ids[0], list)
        with lock:
            running[0] += len(ids)
            admitted = running[0]
        if mf > float(env.get("FAKE_OOM_MF", "1.0")):
            # SGLang's pools took the memory the decode activations needed: the first decode dies.
            log(f"Prefill batch, #new-seq: {len(ids)}, #new-token: 8, #cached-token: 0, full token usage: 0.50, #running-req: {admitted}, #queue-req: 0, cuda graph: False, input throughput (token/s): 1.00")
            log("Scheduler hit an exception: Traceback (most recent call last):")
            log("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.83 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.77 GiB is free.")
            time.sleep(0.2)
            os._exit(1)
        time.sleep(0.4)  # every batch is in flight at once
        with lock:
            running[0] -= len(ids)
        self._json(200, [{"meta_info": {"completion_tokens": sp["max_new_tokens"]}} for _ in ids])

serve_until_killed(H, host, port, 0.0, log)
'''


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    py = fake_python(tmp_path, FAKE)
    pidfile = tmp_path / "pids.txt"
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    monkeypatch.setenv("FAKE_BUDGET_GB", "10")
    monkeypatch.setenv("FAKE_KV_GB_PER_TOKEN", "0.0001")
    for k in ("FAKE_FAIL_ABOVE", "FAKE_ADMIT_CAP", "FAKE_OOM_MF", "SGLANG_PLUGINS"):
        monkeypatch.delenv(k, raising=False)
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
                                               "vocab_size": 2048}))
    return dict(py=py, model=str(d), pidfile=pidfile, out=tmp_path / "out")


def _true_max(extra_gb: float, tpr: int, budget=10.0, kv=0.0001) -> int:
    """The largest N whose fit is N in the fake: (N + 1) * slot + N * tpr * kv <= budget."""
    slot = 0.02 + 0.001 + extra_gb
    return math.floor((budget - slot) / (slot + tpr * kv))


def _probe(fake, *extra):
    argv = ["--out", str(fake["out"]), "--model-dir", fake["model"], "--python", fake["py"], "--input-len", "8",
            "--output-len", "12", "--calib-n", "8", "--batch", "64", "--startup-timeout", "30", *extra]
    rc = fp.main(argv)
    return rc, json.loads((fake["out"] / "fit.json").read_text())


def test_probe_finds_each_sides_largest_fit_and_reaches_it(fake, capsys):
    rc, res = _probe(fake)
    assert rc == 0
    tpr = 8 + 12 + 4
    want = {"stock": _true_max(0.08, tpr), "ours": _true_max(0.005, tpr)}
    for side, r in res["sides"].items():
        # the log's sizes are rounded, so the prediction may land one below the exact maximum
        assert want[side] - 1 <= r["prediction"]["n"] <= want[side], side
        assert r["fit"]["fit"] == r["prediction"]["n"] == r["verify_launch"]["n"]
        assert r["fit"]["fit"] <= r["max_fit"] <= want[side] + 1
        assert r["fit"]["upper"] >= r["max_fit"]  # the one-launch bound is looser
        assert r["kv_shrinks_with_n"] is True
        assert r["load"]["ok"] == r["fit"]["fit"] and r["load"]["failed"] == 0
        assert r["reached"] == r["fit"]["fit"]
    rs = res["ratios"]
    assert rs["fit_ratio"] == pytest.approx(want["ours"] / want["stock"], rel=0.02)
    assert rs["conservative_ratio"] == pytest.approx(
        res["sides"]["ours"]["reached"] / res["sides"]["stock"]["max_fit"])
    report = (fake["out"] / "report.md").read_text()
    assert "conservative" in report and "| ours | 8 |" in report
    assert "scripts/fit_probe.py --out" in res["command"]
    assert_all_stopped(fake["pidfile"])


def test_a_server_that_admits_fewer_lowers_the_conservative_ratio(fake, monkeypatch):
    monkeypatch.setenv("FAKE_ADMIT_CAP", "150")
    rc, res = _probe(fake, "--sides", "ours", "--start-n", "ours=300")
    assert rc == 0
    r = res["sides"]["ours"]
    assert r["prediction"] == {"n": 300, "source": "--start-n"} and "calibration" not in r
    assert r["fit"]["fit"] == 300 and r["reached"] == 150  # reported as measured, not as the fit


def test_a_launch_that_does_not_start_is_retried_lower(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_ABOVE", "95")
    rc, res = _probe(fake, "--sides", "stock", "--start-n", "stock=100")
    assert rc == 0
    r = res["sides"]["stock"]
    assert [f["n"] for f in r["failed_launches"]] == [100]
    assert r["verify_launch"]["n"] == 90 and r["fit"]["fit"] == 90 and r["reached"] == 90
    monkeypatch.setenv("FAKE_FAIL_ABOVE", "10")
    rc, res = _probe(fake, "--sides", "stock", "--start-n", "stock=100", "--redo")
    assert rc == 1 and "failed twice" in res["sides"]["stock"]["error"]
    assert_all_stopped(fake["pidfile"])


def test_sides_in_separate_calls_are_merged_and_the_budget_leaves_a_side(fake):
    rc, res = _probe(fake, "--sides", "ours,stock", "--time-budget", "120", "--min-side-s", "1000")
    assert rc == 3 and res["sides"] == {}  # nothing started: each side needs --min-side-s
    rc, res = _probe(fake, "--sides", "stock")
    assert rc == 0 and list(res["sides"]) == ["stock"] and "fit_ratio" not in res["ratios"]
    rc, res = _probe(fake, "--sides", "stock,ours")  # stock is kept, ours is probed
    assert rc == 0 and set(res["sides"]) == {"stock", "ours"}
    assert res["sides"]["stock"]["command"].endswith("--sides stock")
    assert res["sides"]["ours"]["command"].endswith("--sides stock,ours")
    assert res["ratios"]["fit_ratio"] > 3
    report = (fake["out"] / "report.md").read_text()
    assert report.count("`python3 scripts/fit_probe.py") == 2  # one provenance line per call
    assert report.index("| stock |") < report.index("| ours |")
    ours_before = res["sides"]["ours"]["command"]
    rc, res = _probe(fake, "--sides", "stock", "--redo")  # stock probed again, ours kept
    assert rc == 0 and set(res["sides"]) == {"stock", "ours"}
    assert res["sides"]["stock"]["command"].endswith("--sides stock --redo")
    assert res["sides"]["ours"]["command"] == ours_before


# Lines of the session-11 H200 log of our server launched at N=3227 with SGLang's default
# --mem-fraction-static (0.907): it admitted 3200 requests, then the first decode ran out of memory.
H200_CRASH_LOG = """\
[2026-12-01 03:53:29] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, full token usage: 0.58, mamba usage: 1.00, #running-req: 3184, #queue-req: 11, #pending-token: 13824, cuda graph: False, input throughput (token/s): 111528.85
[2026-12-01 03:53:29] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, full token usage: 0.58, mamba usage: 1.00, #running-req: 3200, #queue-req: 0, #pending-token: 5632, cuda graph: False, input throughput (token/s): 99032.78
[2026-12-01 03:53:30] Scheduler hit an exception: Traceback (most recent call last):
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.83 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.77 GiB is free.
"""


def test_load_facts_of_a_server_that_crashed_under_the_load():
    f = fp.load_log_facts(H200_CRASH_LOG)
    assert f["admitted"] == 3200 and f["reached"] == 0 and f["oom"]
    assert f["crash"].startswith("torch.OutOfMemoryError")
    ok = fp.load_log_facts(H200_CRASH_LOG.split("[2026-12-01 03:53:30]")[0])
    assert ok == dict(reached=0, admitted=3200, crash=None, oom=False)
    assert fp.mem_fraction("server_args=ServerArgs(mem_fraction_static=0.907, x=1)") == 0.907


def test_an_out_of_memory_load_is_relaunched_with_a_lower_mem_fraction(fake, monkeypatch):
    monkeypatch.setenv("FAKE_OOM_MF", "0.85")  # the fake dies under load above this fraction
    rc, res = _probe(fake, "--sides", "ours", "--start-n", "ours=100")
    assert rc == 0
    r = res["sides"]["ours"]
    assert [c["mem_fraction_static"] for c in r["crashed_loads"]] == [0.907]
    assert r["crashed_loads"][0]["admitted"] > 0 and "OutOfMemoryError" in r["crashed_loads"][0]["crash"]
    assert r["verify_launch"]["mem_fraction_static"] == 0.807 and "crash" not in r
    assert r["reached"] == r["fit"]["fit"] == 100
    report = (fake["out"] / "report.md").read_text()
    assert "crashed under them" in report and "| 0.807 |" in report
    # with no relaunch allowed the side stays crashed, and a crashed side enters no ratio
    monkeypatch.setenv("FAKE_OOM_MF", "0.5")
    rc, res = _probe(fake, "--sides", "stock,ours", "--start-n", "stock=50,ours=100", "--redo", "--oom-retries", "0")
    assert rc == 1
    assert res["sides"]["ours"]["crash"] and res["ratios"] == {}
    assert "**the server crashed under the load**" in (fake["out"] / "report.md").read_text()
    assert_all_stopped(fake["pidfile"])


def test_a_relaunch_with_less_memory_asks_for_fewer_requests():
    # session 11, ours: slot 30.99 MiB + KV 7.54 MiB per request, 139.09 GB on the GPU at start
    pred = {"slot_mib": 30.99, "kv_mib_per_request": 7.54}
    assert fp.n_after_mem_step(3227, pred, 139.09, 0.1) == 3227 - 370
    assert fp.n_after_mem_step(3227, {"n": 3227, "source": "--start-n"}, 139.09, 0.1) == 3227
    assert fp.n_after_mem_step(3227, pred, None, 0.1) == 3227
    assert fp.n_after_mem_step(10, pred, 139.09, 0.1) == 1


# session 15, ours at N=2540 and --mem-fraction-static 0.707 on the H200 (the pool lines of its log)
H200_OURS_0707_LOG = """\
[2026-12-02 00:13:23] Load weight begin. avail mem=139.09 GB
[2026-12-02 00:13:24] Mamba Cache is allocated. max_mamba_cache_size: 2540, conv_state size: 1.40GB, ssm_state size: 59.55GB 
[2026-12-02 00:13:24] ReplaySSM pool (gdn, 12 SSM layers, ring_len=16, rings in bfloat16): per slot checkpoint 24.00 MiB + rings 5.30 MiB + cursors 8 B; 2541 slots: checkpoints 59.555 GiB, rings 13.144 GiB; speculative: no per-draft state snapshots (the rings replace them), conv windows 2.792 GiB
[2026-12-02 00:13:24] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 2008787, K size: 7.66 GB, V size: 7.66 GB
[2026-12-02 00:13:24] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 2008787, K size: 1.92 GB, V size: 1.92 GB
[2026-12-02 00:13:51] max_total_num_tokens=2008787, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2540, context_len=32768, available_gpu_mem=35.51 GB
"""


def test_a_relaunch_balances_n_from_the_crashed_launchs_own_pools():
    facts = bs.parse_server_facts(H200_OURS_0707_LOG)
    tpr = 512 + 256 + 4
    own = fp.predict_fit(fp.memory_split(facts), tpr)
    assert own["n"] == 2552  # where this launch's slots and KV balance (it served 2540 at once)
    step_requests = math.ceil(0.1 * 139.09 * 1024 / (own["slot_mib"] + own["kv_mib_per_request"]))
    # a --start-n launch above the balance (no calibrated prediction): the relaunch drops to the
    # balance less what 0.1 of the GPU held, not just N less that
    n, used = fp.relaunch_n(2857, facts, {"n": 2857, "source": "--start-n"}, 139.09, 0.1, tpr)
    assert n == 2552 - step_requests and used["source"] == "the crashed launch's pools"
    # a launch below the balance keeps its N when the lower fraction still holds it
    assert fp.relaunch_n(1500, facts, {}, 139.09, 0.1, tpr)[0] == 1500
    # no pool lines in the log: the side's prediction as before
    pred = {"slot_mib": 30.99, "kv_mib_per_request": 7.54}
    assert fp.relaunch_n(3227, {}, pred, 139.09, 0.1, tpr) == (3227 - 370, pred)
