"""CPU tests of scripts/bench_serving.py: recipes, log parsing, metrics, report, the streaming client,
and whole sweeps (launch, cases, resume, skip, failure, shutdown) against a fake
``sglang.launch_server`` that speaks SGLang's streaming /generate and prints its log lines."""

import json
import gzip
import os
import shlex
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fake_procs import FAKE_SERVER_PRELUDE, assert_all_stopped, fake_python, python_without_plugin
from script_loader import load_script

bs = load_script("bench_serving")
mtm = load_script("make_tiny_model")

# ----------------------------------------------------------------------------------------------
# Recipes
# ----------------------------------------------------------------------------------------------


def _config_from_cmd(cmd):
    """Run make_tiny_model's own argument parsing and config construction on a build command."""
    a = mtm.parse_args(cmd[2:])
    fields = mtm.resolve_fields(a.preset, a.shape, {f: getattr(a, f) for f in mtm.FLAG_FIELDS}, dict(a.set))
    cfg, patch = mtm.make_config(a.preset, fields)
    return a, fields, patch


def test_layer_patterns():
    assert bs.layer_pattern("gdn", 24) == {"num_layers": 32, "full_attention_interval": 4}
    assert bs.layer_pattern("qwen35_4b", 24) == {"num_layers": 32, "full_attention_interval": 4}
    with pytest.raises(ValueError, match="qwen35_4b"):
        bs.layer_pattern("qwen35_4b", 4)
    with pytest.raises(ValueError):
        bs.layer_pattern("gdn", 25)
    p = bs.layer_pattern("nano9b", 24)["pattern"]
    assert p.count("M") == 24 and p.count("*") == 3 and set(p) == set("M-*")
    p = bs.layer_pattern("super", 20)["pattern"]
    assert p.count("M") == 20 and p.count("E") == 20 and p.count("*") == 4
    assert "*" in bs.layer_pattern("super", 3)["pattern"]  # always one attention layer
    with pytest.raises(ValueError):
        bs.layer_pattern("super", 0)


def test_build_commands_are_accepted_by_make_tiny_model():
    cmd = bs.build_model_cmd("py", "gdn", 24, "dummy", None, "/tmp/x")
    assert "--no-weights" in cmd and "--accept-rate-knob" not in cmd
    a, fields, patch = _config_from_cmd(cmd)
    assert a.no_weights and fields["num_hidden_layers"] == 32 and patch["full_attention_interval"] == 4
    assert fields["linear_num_value_heads"] == 32 and fields["linear_num_key_heads"] == 16
    assert fields["linear_key_head_dim"] == fields["linear_value_head_dim"] == 128
    cmd = bs.build_model_cmd("py", "gdn", 12, "knob", 0.5, "/tmp/x", build_flags="--num-experts 16")
    a, fields, _ = _config_from_cmd(cmd)
    assert not a.no_weights and a.accept_rate_knob == 0.5 and a.knob_mode == "raw" and a.no_measure
    assert fields["num_hidden_layers"] == 16
    a, _, _ = _config_from_cmd(bs.build_model_cmd("py", "gdn", 12, "knob", 0.0, "/tmp/x"))
    assert a.knob_mode == "calibrated"  # end point: no calibration needed
    a, fields, patch = _config_from_cmd(bs.build_model_cmd("py", "nano9b", 24, "dummy", None, "/tmp/x"))
    assert fields["mamba_num_heads"] == 128 and fields["mamba_head_dim"] == 80 and fields["n_groups"] == 8
    assert patch["hybrid_override_pattern"].count("M") == 24
    a, fields, patch = _config_from_cmd(bs.build_model_cmd("py", "super", 8, "knob", 0.0, "/tmp/x"))
    assert fields["mamba_head_dim"] == 64 and patch["mtp_hybrid_override_pattern"] == "*E"
    with pytest.raises(ValueError):
        bs.build_model_cmd("py", "nano9b", 24, "knob", 0.0, "/tmp/x")  # no MTP head
    # Qwen3.5-4B look-alike: dense (no experts), its real layer count by default, MTP for spec.
    a, fields, patch = _config_from_cmd(bs.build_model_cmd("py", "qwen35_4b", 24, "knob", 0.0, "/tmp/x"))
    assert a.preset == "qwen3_5" and fields["num_hidden_layers"] == 32 and patch["full_attention_interval"] == 4
    assert (fields["hidden_size"], fields["intermediate_size"], fields["vocab_size"]) == (2560, 9216, 248320)
    assert (fields["linear_num_key_heads"], fields["linear_num_value_heads"]) == (16, 32)
    assert (fields["num_attention_heads"], fields["num_key_value_heads"], fields["head_dim"]) == (16, 4, 256)
    assert "num_experts" not in fields
    assert bs.MODELS["qwen35_4b"]["default_ssm_layers"] == bs.DEFAULT_SPEC_SSM_LAYERS["qwen35_4b"] == 24
    assert bs.model_tag("gdn", 24, "dummy", None) == "gdn-24ssm-dummy"
    assert bs.model_tag("gdn", 12, "knob", 0.3) == "gdn-12ssm-knob0.3"
    assert bs.model_tag("gdn", 12, "knob", 0.3, "--x 1") != bs.model_tag("gdn", 12, "knob", 0.3, "--x 2")


def test_sides():
    assert bs.side_server_args("stock", "decode", None) == ("triton", False, [])
    assert bs.side_server_args("upstream", "decode", 8) == ("triton", False, ["--enable-linear-replayssm",
                                                                             "--mamba-radix-cache-strategy", "no_buffer",
                                                                             "--disable-overlap-schedule",
                                                                             "--linear-replayssm-cache-len", "8"])
    assert bs.side_server_args("upstream", "spec", 8) == ("triton", True, ["--enable-linear-replayssm-spec"])
    assert bs.side_server_args("ours", "spec", 16) == ("replayssm", True, ["--replayssm-ring-len", "16"])
    assert bs.side_server_args("nospec", "spec", None) == ("triton", False, [])
    assert bs.side_applicable("upstream", "decode", "gdn")[0]
    ok, why = bs.side_applicable("upstream", "decode", "mamba2")
    assert not ok and "GDN" in why
    assert not bs.side_applicable("nospec", "decode", "gdn")[0]
    env = {"A": "1"}
    assert bs.side_plugin_env(env, "upstream")["SGLANG_PLUGINS"] == bs.e2e.NO_PLUGINS
    assert "SGLANG_PLUGINS" not in bs.side_plugin_env(env, "ours")


# ----------------------------------------------------------------------------------------------
# Log parsing (lines in SGLang 0.5.17's / our pool's formats)
# ----------------------------------------------------------------------------------------------

LOG = """\
[2026-11-30 10:00:00] Mamba Cache is allocated. max_mamba_cache_size: 300, conv_state size: 0.33GB, ssm_state size: 14.12GB intermediate_ssm_state_cache size: 56.60GB intermediate_conv_window_cache size: 1.32GB
[2026-11-30 10:00:00] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 400000, K size: 3.05 GB, V size: 3.05 GB
[2026-11-30 10:00:01] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 400000, K size: 0.38 GB, V size: 0.38 GB
[2026-11-30 10:00:02] max_running_requests is capped to 290 by the mamba state cache (max_mamba_cache_size=300, 1 state slots per request).
[2026-11-30 10:00:03] max_total_num_tokens=400000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=290, context_len=32768, available_gpu_mem=20.11 GB
"""
OURS_LOG = """\
[x] ReplaySSM memory: 512 mamba slots (+1 padding) x 51.13 MiB (state 48.00 + rings 3.13 MiB); no per-draft state scratch reserved; 40.00 GiB left for the KV cache.
[x] Mamba Cache is allocated. max_mamba_cache_size: 512, conv_state size: 0.56GB, ssm_state size: 24.05GB intermediate_ssm_state_cache size: 0.00GB intermediate_conv_window_cache size: 0.11GB
[x] ReplaySSM pool (gdn, 24 SSM layers, ring_len=16, rings in bfloat16): per slot checkpoint 48.00 MiB + rings 3.13 MiB + cursors 8 B; 513 slots: checkpoints 24.047 GiB, rings 1.568 GiB; speculative: no per-draft state snapshots (the rings replace them), conv windows 0.110 GiB
"""
UP_LOG = ("[x] GDN ReplaySSM ring buffers allocated (record_len=16, fold=True): d=0.500GB, k=0.250GB, g=0.004GB "
          "rawv=0.500GB, rawk=0.250GB, beta=0.004GB \n[x] Mamba Cache is allocated. max_mamba_cache_size: 255, "
          "conv_state size: 0.28GB, ssm_state size: 12.00GB \n")
DECODE_LINES = """\
[x] Decode batch, #running-req: 8, #full token: 4000, full token usage: 0.01, mamba num: 8, mamba usage: 0.03, accept len: 3.10, accept rate: 0.70, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 0
[x] Decode batch, #running-req: 8, #full token: 4100, full token usage: 0.01, mamba num: 8, mamba usage: 0.03, accept len: 3.30, accept rate: 0.77, cuda graph: True, gen throughput (token/s): 1100.00, #queue-req: 0
[x] Decode batch, #running-req: 8, #full token: 4100, full token usage: 0.01, mamba num: 8, mamba usage: 0.03, accept len: 3.20, accept rate: 0.73, cuda graph: False, gen throughput (token/s): 1000.00, #queue-req: 0
[x] Decode batch, #running-req: 3, #full token: 900, full token usage: 0.00, mamba num: 3, mamba usage: 0.01, accept len: 2.00, accept rate: 0.33, cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0
"""


def test_parse_server_facts_and_fit():
    f = bs.parse_server_facts(LOG)
    assert f["max_running_requests"] == 290 and f["max_total_num_tokens"] == 400000
    assert f["mamba_slots"] == 300 and f["ssm_state_gb"] == 14.12
    assert f["intermediate_ssm_gb"] == 56.60 and f["intermediate_conv_gb"] == 1.32
    assert [k["tokens"] for k in f["kv_caches"]] == [400000, 400000]
    assert f["kv_caches"][0]["gb"] == pytest.approx(6.10)
    assert f["capped_by_mamba"] == 290
    fit = bs.fit_concurrency(f, 512, 256, spec=True)
    assert fit["by_kv"] == 400000 // (512 + 256 + 4) and fit["fit"] == 290
    fit = bs.fit_concurrency(f, 8192, 8192, spec=False)
    assert fit["fit"] == 400000 // 16384 == 24
    mem = bs.memory_summary(f, bs.fit_concurrency(f, 512, 256, True))
    assert mem["intermediate_ssm_gib"] == 56.60
    assert mem["intermediate_ssm_mib_per_request"] == pytest.approx(56.60 * 1024 / 291)
    assert "replayssm_rings_gib" not in mem

    o = bs.parse_server_facts(OURS_LOG)
    rs = o["replayssm"]
    assert rs["family"] == "gdn" and rs["ssm_layers"] == 24 and rs["ring_len"] == 16 and rs["ring_dtype"] == "bfloat16"
    assert rs["rings_mib_per_slot"] == 3.13 and rs["checkpoint_mib_per_slot"] == 48.0 and rs["slots"] == 513
    assert rs["rings_gib"] == 1.568 and o["replayssm_memory"]["slots"] == 512
    assert rs["conv_windows_gib"] == 0.110  # the speculative pool's per-draft conv windows
    assert o["intermediate_ssm_gb"] == 0.0 and o.get("max_running_requests") is None
    mem = bs.memory_summary(o, bs.fit_concurrency(o, 512, 256, True))
    assert mem["replayssm_rings_gib"] == 1.568 and mem["replayssm_rings_mib_per_slot"] == 3.13
    assert "intermediate_ssm_gib" not in mem  # 0.00 GB is not a scratch buffer

    u = bs.parse_server_facts(UP_LOG)
    assert u["upstream_rings"]["record_len"] == 16
    assert u["upstream_rings"]["total_gb"] == pytest.approx(1.508)
    assert u["intermediate_ssm_gb"] is None  # no spec: the pool line has no intermediate fields
    assert bs.memory_summary(u, {})["upstream_rings_mib_per_slot"] == pytest.approx(1.508 * 1024 / 256)
    assert bs.fit_concurrency({}, 1, 1, False)["fit"] is None


def test_decode_lines():
    lines = bs.parse_decode_lines(DECODE_LINES)
    assert [ln["running"] for ln in lines] == [8, 8, 8, 3]
    assert lines[0]["accept_len"] == 3.10 and lines[2]["cuda_graph"] is False
    s = bs.decode_line_summary(lines, 8)
    assert s["lines_at_c"] == 3 and s["server_gen_throughput"] == 1000.0
    assert s["cuda_graph_share"] == pytest.approx(2 / 3) and s["server_accept_len"] == 3.2
    s = bs.decode_line_summary(lines, 64)  # none at C: all lines
    assert s["lines_at_c"] == 0 and s["max_running"] == 8 and s["server_gen_throughput"] == 950.0
    no_spec = DECODE_LINES.replace("accept len: 3.10, accept rate: 0.70, ", "")
    assert bs.parse_decode_lines(no_spec)[0]["accept_len"] is None
    assert bs.decode_line_summary([], 1)["server_gen_throughput"] is None


def test_decode_only_windows():
    """A decode-batch line's rate covers the time since the previous decode line: it is a decode-step
    rate only when that previous line exists and no prefill batch ran in between (session 25's
    spec cases: one such window per side, 1.19x, while the median over all windows said 0.77x)."""
    pre = ("[x] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, token usage: 0.01, "
           "#running-req: 1, #queue-req: 0, input throughput (token/s): 95000.00\n")
    d = DECODE_LINES.splitlines(keepends=True)
    text = pre + d[0] + pre + d[1] + d[2] + d[3]
    lines = bs.parse_decode_lines(text)
    assert [ln["clean"] for ln in lines] == [False, False, True, True]
    s = bs.decode_line_summary(lines, 8)
    assert s["clean_lines_at_c"] == 1 and s["server_gen_throughput_clean"] == 1000.0
    assert s["server_gen_throughput"] == 1000.0  # the median over all windows at C keeps its meaning
    # The first line of a slice has no previous decode line in it: never clean.
    assert bs.parse_decode_lines(d[0] + d[1])[0]["clean"] is False
    assert bs.decode_line_summary(bs.parse_decode_lines(pre + d[3]), 3)["server_gen_throughput_clean"] is None
    assert bs.decode_line_summary([], 1)["clean_lines_at_c"] == 0


def test_log_windows_cli(tmp_path, capsys):
    """`--log-windows LOG` reads server logs without --out and launches nothing."""
    pre = ("[x] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, token usage: 0.01, "
           "#running-req: 1, #queue-req: 0, input throughput (token/s): 95000.00\n")
    d = DECODE_LINES.splitlines(keepends=True)
    log = tmp_path / "server.log"
    log.write_text(pre + d[0] + d[1] + pre + d[2])
    assert bs.main(["--log-windows", str(log)]) == 0
    out = capsys.readouterr().out
    assert "3 decode-batch lines" in out and "running 8: decode-only median 1100.0 tok/s over 1" in out
    with pytest.raises(SystemExit):
        bs.parse_args(["--model", "gdn"])  # --out is still required for a run


def test_log_windows_reads_the_diag_flush_lines(tmp_path, capsys):
    """REPLAYSSM_DIAG_FLUSH lines, in the backend's own format (a real log record), are summarised
    by `--log-windows`: the mean flush share and the batches where every row or no row flushed."""
    import logging
    from types import SimpleNamespace

    import torch

    from sglang_replayssm.backends.common import ReplaySSMBatchState

    records = []
    handler = logging.Handler()
    handler.emit = lambda rec: records.append(rec.getMessage())
    log = logging.getLogger("sglang_replayssm")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        st = SimpleNamespace(_diag_batches=0, ring_len=4)
        for k, (wp, fl) in enumerate([([3, 3, 3, -1], [1, 1, 1, 0]), ([0, 1, 2, 0], [0, 0, 0, 0]),
                                      ([3, 0, 1, 2], [1, 0, 0, 0])]):
            st._diag_batches = k + 1
            slots = torch.tensor([0, 1, 2, -1 if k == 0 else 3], dtype=torch.int32)
            ReplaySSMBatchState._log_rows(st, slots, torch.tensor([max(x, 0) for x in wp], dtype=torch.int32),
                                          torch.tensor(fl, dtype=torch.int32))
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    path = tmp_path / "ours.log"
    path.write_text("".join(f"[2026-12-04 16:30:00] {m}\n" for m in records))
    recs = bs.parse_diag_flush(path.read_text())
    assert [(r["rows"], r["flush"]) for r in recs] == [(3, 3), (4, 0), (4, 1)]
    assert recs[0]["hist"] == [0, 0, 0, 3]
    assert bs.main(["--log-windows", str(path)]) == 0
    out = capsys.readouterr().out
    assert "diag flush: 3 logged decode batches, mean flush share 0.417, 1 with every row flushing, 1 with none" in out


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------


def test_percentile_matches_numpy_linear():
    import numpy as np

    v = [5.0, 1.0, 9.0, 3.0, 7.5, 2.2]
    for q in (0, 10, 50, 90, 99, 100):
        assert bs.percentile(v, q) == pytest.approx(float(np.percentile(v, q)))
    assert bs.percentile([], 50) is None


def test_wave_timing():
    """Two waves of 3: the first ends over 0.1 s; the second is sent over 0.5 s, 0.4 s after the last
    first-wave end at worst, which is client lag."""
    first = [dict(t_send_s=0.0, latency_s=1.0), dict(t_send_s=0.0, latency_s=1.05),
             dict(t_send_s=0.01, latency_s=1.09)]
    second = [dict(t_send_s=1.0, latency_s=1.0), dict(t_send_s=1.05, latency_s=1.0),
              dict(t_send_s=1.5, latency_s=1.0)]
    w = bs.wave_timing(second + first, 3)  # any order in, sorted by send time inside
    assert w["wave1_end_spread_s"] == pytest.approx(0.1)
    assert w["wave2_send_spread_s"] == pytest.approx(0.5)
    assert w["client_lag_max_s"] == pytest.approx(0.4)
    assert bs.wave_timing(first, 3)["wave2_send_spread_s"] is None  # one wave only
    assert bs.request_timeline(second)[2] == [1.5, None, 1.0, 0]
    cases = [_case("stock", 8, 100.0), _case("ours", 8, 90.0)]
    cases[1]["metrics"].update(w)
    md = bs.markdown_report(cases, [], [])
    assert "ours C=8: second wave sent over 0.50 s (first wave ended over 0.10 s, client lag <= 0.40 s)" in md
    assert "after the server did" not in md
    cases[0]["metrics"].update(max_stream_lag_ms=4900.0, median_stream_lag_ms=4800.0, stream_mb=230.0)
    md = bs.markdown_report(cases, [], [])
    assert "stock C=8: the client saw requests end up to 4.90 s after the server did (median 4.80 s" in md
    assert "stock C=8: second wave" not in md


def test_summarize_requests():
    reqs = [
        dict(ok=True, ttft_s=0.1, latency_s=1.1, output_tokens=11, verify_ct=4),   # TPOT 100 ms
        dict(ok=True, ttft_s=0.2, latency_s=2.2, output_tokens=11, verify_ct=6),   # TPOT 200 ms
        dict(ok=True, ttft_s=0.1, latency_s=0.1, output_tokens=1, verify_ct=None),  # no TPOT
        dict(ok=False, error="boom", output_tokens=0),
    ]
    m = bs.summarize_requests(reqs, duration_s=2.5, concurrency=4)
    assert m["completed"] == 3 and m["failed"] == 1 and m["errors"] == ["boom"]
    assert m["total_output_tokens"] == 23 and m["output_throughput"] == pytest.approx(23 / 2.5)
    assert m["median_tpot_ms"] == pytest.approx(150.0) and m["mean_tpot_ms"] == pytest.approx(150.0)
    assert m["accept_length"] == pytest.approx(22 / 10)  # token-weighted over spec requests
    assert m["median_ttft_ms"] == pytest.approx(100.0)
    assert m["stream_mb"] is None and m["median_stream_lag_ms"] is None  # records without them
    assert bs.summarize_requests([], 0.0, 1)["output_throughput"] is None
    reqs[0].update(stream_bytes=3_000_000, server_e2e_s=0.6)   # the client saw the end 500 ms late
    reqs[1].update(stream_bytes=1_000_000, server_e2e_s=2.1)   # 100 ms late
    reqs[3].update(stream_bytes=7_000_000, server_e2e_s=0.0)   # failed: not counted
    m = bs.summarize_requests(reqs, duration_s=2.5, concurrency=4)
    assert m["stream_mb"] == pytest.approx(4.0)
    assert m["median_stream_lag_ms"] == pytest.approx(300.0) and m["max_stream_lag_ms"] == pytest.approx(500.0)
    assert bs.num_prompts_for(1, 2, 4) == 4 and bs.num_prompts_for(128, 2, 4) == 256
    assert bs.case_seed(0, 8) != bs.case_seed(0, 32) and bs.case_seed(1, 8) != bs.case_seed(0, 8)


def test_sglang_client_cmd_and_parse(tmp_path):
    cmd = bs.sglang_client_cmd("py", "http://h:1", "/m", 512, 256, 64, 32, 7, str(tmp_path / "o.jsonl"))
    s = " ".join(cmd)
    assert "-m sglang.benchmark.serving" in s and "--dataset-name random-ids" in s and "--tokenize-prompt" in s
    assert "--max-concurrency 32" in s and "--random-range-ratio 1.0" in s and "--num-prompts 64" in s
    rec = dict(duration=10.0, completed=64, total_output_tokens=16384, output_throughput=1638.4,
               request_throughput=6.4, mean_tpot_ms=19.0, median_tpot_ms=18.5, p99_tpot_ms=25.0,
               median_ttft_ms=120.0, accept_length=2.9)
    (tmp_path / "o.jsonl").write_text(json.dumps({"output_throughput": 1.0}) + "\n" + json.dumps(rec) + "\n")
    m = bs.parse_sglang_client_output(str(tmp_path / "o.jsonl"), 32)
    assert m["output_throughput"] == 1638.4 and m["median_tpot_ms"] == 18.5 and m["accept_length"] == 2.9
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(ValueError):
        bs.parse_sglang_client_output(str(tmp_path / "e.jsonl"), 1)


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def _case(side, c, tok_s, tpot=10.0, accept=None, study="decode", share=1.0, fit=1024, tag="m"):
    return dict(ok=True, tag=tag, study=study, side=side, concurrency=c, input_len=8, output_len=4,
                model_desc="desc", metrics=dict(output_throughput=tok_s, median_tpot_ms=tpot, accept_length=accept),
                server_log=dict(cuda_graph_share=share), fit=dict(fit=fit))


def test_report_speedups_and_notes():
    cases = [_case("stock", 1, 100.0), _case("ours", 1, 150.0), _case("upstream", 1, 120.0),
             _case("stock", 256, 1000.0), _case("ours", 256, 2500.0, share=0.5), _case("upstream", 256, 1250.0, fit=200),
             dict(ok=False, tag="m", study="decode", side="ours", concurrency=8, input_len=8, output_len=4,
                  error="server: exited")]
    rows = bs.speedup_rows(bs.group_cases(cases)[("m", "decode", 8, 4)], "decode")
    assert [r["concurrency"] for r in rows] == [1, 256]
    assert rows[0]["ours/stock"] == pytest.approx(1.5) and rows[1]["ours/stock"] == pytest.approx(2.5)
    assert rows[1]["ours/upstream"] == pytest.approx(2.0)
    md = bs.markdown_report(cases, [], [dict(date="D", gpu="G", command="cmd x", sglang_version="0.5.17",
                                              client="builtin")])
    assert "`cmd x`" in md and "G" in md
    assert "| 256 | 1000.0 | 1250.0 | 2500.0 |" in md
    assert "2.500x" in md and "2.000x" in md
    assert "ours C=256: CUDA graph on 50%" in md and "upstream C=256: above the server's admitted concurrency (200)" in md
    assert "ours C=8: server: exited" in md
    table = bs.short_table(cases)
    assert "ours/stock" in table and "2.500x" in table
    spec = [_case("stock", 8, 300.0, accept=3.0, study="spec"), _case("ours", 8, 330.0, accept=3.0, study="spec"),
            _case("nospec", 8, 150.0, study="spec")]
    rows = bs.speedup_rows(bs.group_cases(spec)[("m", "spec", 8, 4)], "spec")
    assert rows[0]["ours/nospec"] == pytest.approx(2.2) and rows[0]["stock/nospec"] == pytest.approx(2.0)
    assert rows[0]["ours/upstream"] is None
    assert "330/3.00" in bs.short_table(spec)
    assert "decode-only" not in bs.short_table(spec)  # no such window logged: no line
    spec[0]["server_log"].update(server_gen_throughput_clean=20000.0, clean_lines_at_c=1)
    spec[1]["server_log"].update(server_gen_throughput_clean=24000.0, clean_lines_at_c=2)
    table = bs.short_table(spec)
    assert "1.200x" in table.splitlines()[-1] and "decode-only log windows" in table.splitlines()[-1]
    assert "24000.0 (2)" in bs.markdown_report(spec, [], [])
    assert bs.short_table([]) == "(no successful cases yet)"


def test_plots_fail_clearly_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    files, err = bs.make_plots([_case("stock", 1, 1.0), _case("ours", 1, 2.0)], tmp_path / "plots")
    assert files == [] and "matplotlib is not importable" in err and "--report-only" in err
    assert bs.make_plots([], tmp_path / "plots") == ([], None)  # nothing to plot: no error


# ----------------------------------------------------------------------------------------------
# Streaming client against a small in-process server
# ----------------------------------------------------------------------------------------------


class _SSEHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "chunked"

    def log_message(self, *a):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["sampling_params"]["max_new_tokens"]
        if self.mode == "error":
            body = b'{"error": "bad"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.mode == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()

        def emit(b):
            if self.mode == "chunked":
                self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
            else:
                self.wfile.write(b)
            self.wfile.flush()

        for k in range(1, n + 1):
            time.sleep(0.002)
            ev = {"text": "", "meta_info": {"completion_tokens": k, "spec_verify_ct": (k + 1) // 2,
                                            "finish_reason": {"type": "length"} if k == n else None}}
            emit(b"data: " + json.dumps(ev).encode() + b"\n\n")
        emit(b"data: [DONE]\n\n")
        if self.mode == "chunked":
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


@pytest.mark.parametrize("mode", ["chunked", "close"])
def test_stream_client(mode):
    handler = type("H", (_SSEHandler,), {"mode": mode})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        reqs, dur = bs.run_load("127.0.0.1", port, [[5, 6, 7]] * 6, 10, 3, quiet=True)
        assert all(r["ok"] for r in reqs), reqs
        assert [r["output_tokens"] for r in reqs] == [10] * 6 and reqs[0]["verify_ct"] == 5
        assert reqs[0]["finish_reason"] == "length"
        assert all(0 < r["ttft_s"] < r["latency_s"] for r in reqs)
        m = bs.summarize_requests(reqs, dur, 3)
        assert m["accept_length"] == pytest.approx(2.0) and m["median_tpot_ms"] >= 1.5
        # At most 3 in flight: 6 requests take two waves of >= 20 ms each.
        assert dur >= 0.04
        # The second wave is sent as the first ends (closed loop): the sends of requests 3-5 come
        # after the first three ended, with little client lag.
        sends = sorted(r["t_send_s"] for r in reqs)
        assert sends[2] < 0.02 and sends[3] >= 0.02
        w = bs.wave_timing(reqs, 3)
        assert w["client_lag_max_s"] < 0.5 and w["wave2_send_spread_s"] >= 0.0
        assert [row[3] for row in bs.request_timeline(reqs)] == [10] * 6
    finally:
        srv.shutdown()


def test_stream_client_errors():
    handler = type("H", (_SSEHandler,), {"mode": "error"})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        reqs, _ = bs.run_load("127.0.0.1", srv.server_address[1], [[1]], 4, 1, quiet=True)
        assert not reqs[0]["ok"] and "HTTP 400" in reqs[0]["error"]
    finally:
        srv.shutdown()
    port = bs.e2e.pick_port(0)  # nothing listens there
    reqs, _ = bs.run_load("127.0.0.1", port, [[1]], 4, 1, quiet=True)
    assert not reqs[0]["ok"] and "Error" in reqs[0]["error"]


# ----------------------------------------------------------------------------------------------
# Whole script against a fake server
# ----------------------------------------------------------------------------------------------

FAKE_SERVER = FAKE_SERVER_PRELUDE + r'''
import json, os, subprocess, sys, threading, time

args, opt = launch_server_args(sys.argv[1:])
port, host = int(opt("--port")), opt("--host", "127.0.0.1")
backend = opt("--mamba-backend")
spec = "--speculative-algorithm" in args
upstream = "--enable-linear-replayssm" in args or "--enable-linear-replayssm-spec" in args
side = "ours" if backend == "replayssm" else ("upstream" if upstream else "stock")
env = os.environ
def log(msg):
    print(f"[fake] {msg}", flush=True)

log("args " + " ".join(args))
if side in env.get("FAKE_FAIL_SIDES", "").split(","):
    log("Traceback (most recent call last):\nRuntimeError: boom")
    sys.exit(1)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(env["FAKE_PIDFILE"], "a") as f:
    f.write(f"{os.getpid()} {child.pid}\n")
import signal
def _term(*_):  # reap the "scheduler" child first: an orphaned zombie lingers ~1 s in this container
    child.terminate()
    child.wait()
    os._exit(0)
signal.signal(signal.SIGTERM, _term)
mrr = int(opt("--max-running-requests", "48"))
slots = 300
if side == "ours":
    log(f"ReplaySSM memory: {slots} mamba slots (+1 padding) x 51.13 MiB (state 48.00 + rings 3.13 MiB); no per-draft state scratch reserved; 40.00 GiB left for the KV cache.")
issm = " intermediate_ssm_state_cache size: 56.60GB intermediate_conv_window_cache size: 1.32GB" if spec and side == "stock" else ""
if spec and side != "stock":
    issm = " intermediate_ssm_state_cache size: 0.00GB intermediate_conv_window_cache size: 0.11GB"
log(f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: 0.33GB, ssm_state size: 14.12GB{issm} ")
if side == "ours":
    log(f"ReplaySSM pool (gdn, 24 SSM layers, ring_len=16, rings in bfloat16): per slot checkpoint 48.00 MiB + rings 3.13 MiB + cursors 8 B; {slots + 1} slots: checkpoints 14.121 GiB, rings 0.920 GiB")
if side == "upstream":
    log("GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): d=0.500GB, k=0.250GB, g=0.004GB ")
oom = side in env.get("FAKE_OOM_SIDES", "").split(",")
if oom:
    log("server_args=ServerArgs(model_path='m', mem_fraction_static=0.907, max_running_requests=256)")
log("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 100000, K size: 3.05 GB, V size: 3.05 GB")
log(f"max_total_num_tokens=100000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests={min(mrr, 290)}, context_len=32768, available_gpu_mem=20.11 GB")
log(f"Capture target {'verify' if spec else 'decode'} CUDA graph end. elapsed=0.10 s")

STEP = {"stock": 0.006, "upstream": 0.004, "ours": 0.003}[side]
ACCEPT = 3 if spec else 1
running = [0]
served = [0]
prof_mark = [0]
lock = threading.Lock()

def report():
    with lock:
        n = running[0]
    if n:
        acc = f"accept len: {ACCEPT:.2f}, accept rate: 0.67, " if spec else ""
        log(f"Decode batch, #running-req: {n}, #full token: 10, full token usage: 0.00, mamba num: {n}, "
            f"mamba usage: 0.00, {acc}cuda graph: True, gen throughput (token/s): {n * ACCEPT / STEP:.2f}, #queue-req: 0")

def reporter():
    while True:
        time.sleep(0.03)
        report()
threading.Thread(target=reporter, daemon=True).start()

class H(JsonHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/flush_cache":
            self._json(200, {})
            return
        if self.path == "/start_profile":  # SGLang exports a chrome trace after num_steps steps
            prof_mark[0] = served[0]
            with lock:
                inflight = running[0]  # requests streaming when the profile was asked for
            prof = json.loads(body)
            assert prof["activities"] == ["GPU"] and prof["num_steps"] > 0
            import gzip
            events = [{"ph": "X", "cat": "kernel", "name": f"{side}_kernel", "dur": 10.0},
                      {"ph": "X", "cat": "kernel", "name": "shared_kernel", "dur": 2.5},
                      {"ph": "X", "cat": "cpu_op", "name": "aten::add", "dur": 99.0}]
            path = os.path.join(prof["output_dir"], "fake-TP-0.trace.json.gz")
            # Like SGLang, answer only once the profiled steps ran: the client must send its load
            # while this request is pending (a client that waits for the answer first gets a 500).
            t0 = time.time()
            while served[0] == prof_mark[0] and time.time() - t0 < 3:
                time.sleep(0.05)
            if served[0] == prof_mark[0]:
                self._json(500, {"error": "no steps ran"})
                return
            with gzip.open(path, "wt") as fh:
                json.dump({"traceEvents": events, "fake_inflight_at_start": inflight}, fh)
            self._json(200, {})
            return
        if oom:  # SGLang's scheduler dies on the first prefill; the HTTP server goes with it
            log("Scheduler hit an exception: Traceback (most recent call last):")
            log("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total "
                "capacity of 139.80 GiB of which 78.31 MiB is free.")
            child.terminate()
            child.wait()
            os._exit(1)
        req = json.loads(body)
        sp = req["sampling_params"]
        assert sp["temperature"] == 0 and sp["ignore_eos"] is True and req["stream"] is True
        assert all(5 <= t < 2048 for t in req["input_ids"]), "prompt ids outside the tokenizer range"
        n = sp["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        def emit(b):
            self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
            self.wfile.flush()
        with lock:
            running[0] += 1
        try:
            done, steps = 0, 0
            time.sleep(0.002)  # prefill
            while done < n:
                time.sleep(STEP)
                done, steps = min(n, done + (1 if steps == 0 else ACCEPT)), steps + 1
                if steps == 2:  # every request's decode shows in the log, however short the case
                    report()
                meta = {"completion_tokens": done}
                if spec:
                    meta["spec_verify_ct"] = steps
                emit(b"data: " + json.dumps({"text": "", "meta_info": meta}).encode() + b"\n\n")
            emit(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        finally:
            with lock:
                running[0] -= 1
                served[0] += 1
        self.close_connection = True

serve_until_killed(H, host, port, float(env.get("FAKE_STARTUP_S", "0.1")), log)
'''


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    py = fake_python(tmp_path, FAKE_SERVER)
    pidfile = tmp_path / "pids.txt"
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    for k in ("FAKE_FAIL_SIDES", "FAKE_STARTUP_S", "SGLANG_PLUGINS"):
        monkeypatch.delenv(k, raising=False)
    models = {}
    for name, cfg in {
        "gdn": {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "vocab_size": 151936},
        "m2": {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 131072},
    }.items():
        d = tmp_path / "models" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(2048)}},
                                                      "added_tokens": [{"id": i} for i in range(5)]}))
        models[name] = str(d)
    return dict(py=py, models=models, pidfile=pidfile, out=tmp_path / "out")


def _run(fake, model, *extra, study="decode", concs="1,4"):
    argv = ["--out", str(fake["out"]), "--model-dir", fake["models"][model], "--tag", model, "--study", study,
            "--python", fake["py"], "--concurrency", concs, "--input-len", "8", "--output-len", "12",
            "--rounds", "2", "--min-prompts", "2", "--startup-timeout", "30", "--no-plots", "--quiet", *extra]
    return bs.main(argv)


def test_decode_sweep_resume_and_report(fake, capsys):
    out = fake["out"]
    rc = _run(fake, "gdn")
    assert rc == 0
    cases = {p.stem: json.loads(p.read_text()) for p in (out / "cases").glob("*.json")}
    assert len(cases) == 6 and all(c["ok"] for c in cases.values())
    ours4 = cases["gdn__decode__ours__c4__i8o12"]
    assert ours4["num_prompts"] == 8 and ours4["metrics"]["completed"] == 8
    assert ours4["metrics"]["total_output_tokens"] == 8 * 12
    assert ours4["fit"]["fit"] == 290 and ours4["fit"]["by_kv"] == 100000 // 20
    assert ours4["server_log"]["lines"] > 0 and ours4["server_log"]["cuda_graph_share"] == 1.0
    # The record keeps the requests' timeline (two waves of 4) and where its log slice lies.
    assert len(ours4["timeline"]) == 8 and ours4["metrics"]["wave2_send_spread_s"] is not None
    lo, hi = ours4["log_span"]
    assert 0 <= lo < hi and "Decode batch" in (out / ours4["log"]).read_text()[lo:hi]
    assert "--mamba-backend replayssm" in " ".join(ours4["server_cmd"])
    assert "--load-format dummy" in " ".join(ours4["server_cmd"])
    up = cases["gdn__decode__upstream__c1__i8o12"]
    assert "--enable-linear-replayssm" in up["server_cmd"] and "--mamba-backend triton" in " ".join(up["server_cmd"])
    # Fake step times: stock 6 ms, upstream 4 ms, ours 3 ms per token.
    s4 = cases["gdn__decode__stock__c4__i8o12"]["metrics"]
    assert ours4["metrics"]["output_throughput"] > s4["output_throughput"]
    assert s4["median_tpot_ms"] > ours4["metrics"]["median_tpot_ms"]
    servers = {p.stem: json.loads(p.read_text()) for p in (out / "servers").glob("*.json")}
    assert servers["gdn__decode__ours"]["memory"]["replayssm_rings_gib"] == 0.920
    assert servers["gdn__decode__upstream"]["memory"]["upstream_rings_gib"] == pytest.approx(0.754)
    assert servers["gdn__decode__stock"]["sglang_plugins"] == bs.e2e.NO_PLUGINS
    assert servers["gdn__decode__ours"]["sglang_plugins"] is None
    md = (out / "report.md").read_text()
    assert "## gdn, decode (input 8, output 12)" in md and "ours/stock" in md and "ours/upstream" in md
    assert "unknown (no nvidia-smi)" in md or "unknown" in md
    assert "bench_serving.py" in md  # the exact command
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].lstrip().startswith("4 ")  # short table printed last
    assert_all_stopped(fake["pidfile"])

    # Resume: nothing left, no server started.
    n_launch = len(fake["pidfile"].read_text().splitlines())
    t0 = time.time()
    assert _run(fake, "gdn") == 0 and time.time() - t0 < 10
    assert len(fake["pidfile"].read_text().splitlines()) == n_launch
    # A new concurrency runs only that case on each side; --only restricts the sides.
    assert _run(fake, "gdn", "--only", "ours", concs="1,2,4") == 0
    assert len(fake["pidfile"].read_text().splitlines()) == n_launch + 1
    assert (out / "cases" / "gdn__decode__ours__c2__i8o12.json").exists()
    assert not (out / "cases" / "gdn__decode__stock__c2__i8o12.json").exists()
    assert _run(fake, "gdn", "--only", "nospec") == 2  # not a side of the decode study
    # Report only, packed for the trip back from the device (no models/, report.md beside it).
    (out / "models" / "m").mkdir(parents=True)
    (out / "models" / "m" / "big.safetensors").write_bytes(b"x" * 100)
    tgz = fake["out"].parent / "back" / "bench.tgz"
    assert bs.main(["--out", str(out), "--report-only", "--no-plots", "--pack", str(tgz)]) == 0
    import tarfile

    names = tarfile.open(tgz).getnames()
    assert "cases/gdn__decode__ours__c2__i8o12.json" in names and "report.md" in names
    assert not any(n.startswith("models") for n in names) and any(n.startswith("logs/") for n in names)
    assert (tgz.parent / "report.md").read_text() == (out / "report.md").read_text()


def test_time_budget_leaves_cases_for_the_next_call(fake, monkeypatch):
    # 39 s budget, 38 s needed to launch a server: the first starts; it takes > 1 s, so the next may not.
    monkeypatch.setenv("FAKE_STARTUP_S", "1.0")
    rc = _run(fake, "gdn", "--time-budget", "39", "--min-server-s", "38", "--min-case-s", "5", concs="1")
    assert rc == 3
    done = sorted(p.stem for p in (fake["out"] / "cases").glob("*.json"))
    assert done == ["gdn__decode__stock__c1__i8o12"]
    monkeypatch.delenv("FAKE_STARTUP_S")
    rc = _run(fake, "gdn", concs="1")
    assert rc == 0 and len(list((fake["out"] / "cases").glob("*.json"))) == 3


def test_mamba2_spec_study_skips_upstream(fake):
    rc = _run(fake, "m2", study="spec", concs="2")
    assert rc == 0
    cases = {p.stem: json.loads(p.read_text()) for p in (fake["out"] / "cases").glob("*.json")}
    skip = cases["m2__spec__upstream__c0__i8o12"]
    assert skip["skipped"] and "GDN" in skip["reason"]
    ours = cases["m2__spec__ours__c2__i8o12"]
    cmd = " ".join(ours["server_cmd"])
    assert "--speculative-algorithm NEXTN" in cmd and "--attention-backend flashinfer" in cmd
    assert "--load-format" not in cmd  # --weights auto: spec uses the built (real) weights
    assert ours["metrics"]["accept_length"] == pytest.approx(12 / 5)  # 1 + 3 + 3 + 3 + 2 tokens in 5 steps
    assert ours["server_log"]["server_accept_len"] == 3.0
    nospec = cases["m2__spec__nospec__c2__i8o12"]
    assert "--speculative-algorithm" not in " ".join(nospec["server_cmd"])
    assert nospec["metrics"]["accept_length"] is None
    servers = {p.stem: json.loads(p.read_text()) for p in (fake["out"] / "servers").glob("*.json")}
    assert servers["m2__spec__stock"]["memory"]["intermediate_ssm_gib"] == 56.60
    assert "intermediate_ssm_gib" not in servers["m2__spec__ours"]["memory"]
    md = (fake["out"] / "report.md").read_text()
    assert "ours/nospec" in md and "## Skipped" in md and "56.60" in md
    assert_all_stopped(fake["pidfile"])


def test_server_failure_is_reported_and_retried(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_SIDES", "ours")
    rc = _run(fake, "gdn", concs="1")
    assert rc == 1
    cases = {p.stem: json.loads(p.read_text()) for p in (fake["out"] / "cases").glob("*.json")}
    assert not cases["gdn__decode__ours__c1__i8o12"]["ok"]
    assert "exited" in cases["gdn__decode__ours__c1__i8o12"]["error"]
    assert cases["gdn__decode__stock__c1__i8o12"]["ok"]
    srv = json.loads((fake["out"] / "servers" / "gdn__decode__ours.json").read_text())
    assert any("Traceback" in p for p in srv["problems"])
    assert "Failed or incomplete" in (fake["out"] / "report.md").read_text()
    monkeypatch.delenv("FAKE_FAIL_SIDES")
    assert _run(fake, "gdn", concs="1") == 0  # only the failed case is retried
    assert json.loads((fake["out"] / "cases" / "gdn__decode__ours__c1__i8o12.json").read_text())["ok"]
    assert_all_stopped(fake["pidfile"])


def test_upstream_oom_names_the_flag_that_fixes_it(fake, monkeypatch):
    # Session 24 on the H200: SGLang's own ReplaySSM server died of a CUDA OOM on its first 256
    # prefills (its rings are allocated after the KV cache is sized). The failed case says why
    # and which flag fixes it, with the fraction computed from its log.
    monkeypatch.setenv("FAKE_OOM_SIDES", "upstream")
    assert _run(fake, "gdn", "--only", "stock,upstream", concs="1") == 1
    err = json.loads((fake["out"] / "cases" / "gdn__decode__upstream__c1__i8o12.json").read_text())["error"]
    assert "--upstream-args=--mem-fraction-static=F" in err
    assert "0.907 - 0.754 / 139.80 = 0.901" in err  # the fake's rings: 0.5 + 0.25 + 0.004 GB
    assert "Failed or incomplete" in (fake["out"] / "report.md").read_text()
    assert_all_stopped(fake["pidfile"])


def test_upstream_oom_hint_from_an_h200_log():
    log = "\n".join([
        "[2026-12-04 10:10:13] server_args=ServerArgs(model_path='/tmp/m', mem_fraction_static=0.907, x=1)",
        "[2026-12-04 10:10:44] GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): d=7.623GB, "
        "k=3.812GB, g=0.060GB ",
        "[2026-12-04 10:10:44] Memory pool end. avail mem=1.37 GB",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total capacity "
        "of 139.80 GiB of which 78.31 MiB is free.",
    ])
    hint = bs.upstream_oom_hint(log)
    assert "(11.495 GB)" in hint and "= 0.824" in hint  # session 24 ran it at 0.825: one step above
    assert bs.upstream_oom_hint(log.replace("OutOfMemoryError", "RuntimeError").replace("CUDA out of memory", "boom")) is None
    assert bs.upstream_oom_hint(log.split("\n", 2)[0] + "\n" + log.splitlines()[-1]) is None  # no upstream rings


def test_sglang_client_refused_when_tokenizer_smaller_than_vocab(fake, capsys):
    assert _run(fake, "gdn", "--client", "sglang", concs="1") == 2
    assert "empty text" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Real checkpoints and real server arguments, parsed by SGLang itself (CPU)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model,study", [("gdn", "decode"), ("nano9b", "decode"), ("gdn", "spec"), ("super", "spec"),
                                         ("qwen35_4b", "decode"), ("qwen35_4b", "spec")])
def test_every_side_server_command_is_accepted_by_sglang(tmp_path, model, study, plugin_env, monkeypatch):
    """Build the study's checkpoint (config + tokenizer, dummy weights) and run SGLang's own argument
    handling (ServerArgs.__post_init__: model config, spec and backend checks, our plugin's guards)
    on every side's exact server command. On the H200 (2026-11-30) every server of the first serving
    call died in SGLang's ModelConfig because such a checkpoint had no `architectures`."""
    from sglang.srt import server_args as sglang_server_args
    from sglang.srt.server_args import prepare_server_args

    # extra_buffer (what `auto` resolves to with the radix cache on) asserts a CUDA-like device
    # before its other checks; in server_args.py only that assertion reads is_musa, so saying yes
    # there lets every later check run on the CPU.
    monkeypatch.setattr(sglang_server_args, "is_musa", lambda: True)
    out = tmp_path / "bench"
    ssm = {"gdn": "3", "qwen35_4b": "3", "nano9b": "2", "super": "2"}[model]
    a = bs.parse_args(["--out", str(out), "--model", model, "--study", study, "--ssm-layers", ssm,
                       "--weights", "dummy", "--models-dir", str(tmp_path / "models")])
    info, err = bs._resolve_model(a, out, None)
    assert err is None, err
    for side in bs.STUDY_SIDES[study]:
        if side == "upstream" and info["family"] != "gdn":
            continue
        cmd = bs._server_cmd(a, info, side, 30000)
        argv = cmd[cmd.index("sglang.launch_server") + 1:]
        # CPU only: no tokenizer process. The command as served, radix cache on: SGLang's strategy
        # checks run there (on the H200, 2026-12-04, SGLang's own ReplaySSM side died twice in them:
        # extra_buffer refused, then no_buffer without --disable-overlap-schedule).
        sa = prepare_server_args(argv + ["--device", "cpu", "--skip-tokenizer-init"])
        assert sa.mamba_backend == ("replayssm" if side == "ours" else "triton"), side
        assert sa.mamba_radix_cache_strategy == ("no_buffer" if side == "upstream" and study == "decode"
                                                 else "extra_buffer"), (side, sa.mamba_radix_cache_strategy)
        assert (sa.speculative_algorithm is not None) == (study == "spec" and side != "nospec"), side


def test_diag_samples_each_case_window(fake, tmp_path):
    """--diag runs every server process under scripts/diag's stack sampler and keeps, per case, the
    samples of that case's window (the sampler's counters are reset after the warm-up)."""
    diag = tmp_path / "diag_work"
    diag.mkdir()
    (diag / "99999999.json").write_text("{}")  # a dump left by a server that is gone
    assert _run(fake, "gdn", "--only", "ours", "--diag", str(diag), concs="2") == 0
    case = json.loads((fake["out"] / "cases" / "gdn__decode__ours__c2__i8o12.json").read_text())
    files = sorted(Path(case["diag"]).glob("*.json"))
    assert files, "no sampler dump was collected for the case"
    assert "99999999.json" not in [f.name for f in files], "a stale dump was collected"
    dumps = [json.loads(f.read_text()) for f in files]
    main = [t for d in dumps for name, t in d["threads"].items() if name == "MainThread"]
    assert main and all(t["samples"] < case["case_wall_s"] + 1.0 for t in main)  # a window, not the server life
    mod = load_script("diag/summarize")
    assert mod.scheduler_profile(Path(case["diag"])) is not None
    # process-wide counters over the same window: CPU, context switches, GC, affinity
    procs = [d["process"] for d in dumps]
    for proc in procs:
        assert 0 <= proc["wall_s"] < case["case_wall_s"] + 1.0 and proc["cpu_s"] >= 0
        assert proc["involuntary_switches"] >= 0 and proc["voluntary_switches"] >= 0
        assert proc["affinity"] and proc["gc_tracked_objects"] > 0
        assert all(len(v) == 3 for v in proc["gc"].values())
        assert "involuntary" in mod.process_line(proc)
    assert_all_stopped(fake["pidfile"])


def test_gpu_profile_per_case(fake):
    """--gpu-profile-steps: after each measured case a short profiled rerun; the case file gets the
    kernel time by name from SGLang's exported trace (CPU ops are not kernels)."""
    assert _run(fake, "gdn", "--only", "stock,ours", "--gpu-profile-steps", "8", concs="2") == 0
    for side in ("stock", "ours"):
        case = json.loads((fake["out"] / "cases" / f"gdn__decode__{side}__c2__i8o12.json").read_text())
        prof = case["gpu_profile"]
        assert prof["steps"] == 8 and prof["kernel_us"] == 12.5 and prof["kernels"] == 2, prof
        assert prof["top"][0] == {"name": f"{side}_kernel", "us": 10.0, "count": 1}
    cases = fake["out"] / "cases"
    r = subprocess.run([sys.executable, str(Path(bs.__file__).parent / "diag" / "gpu_compare.py"),
                        str(cases / "gdn__decode__stock__c2__i8o12.json"),
                        str(cases / "gdn__decode__ours__c2__i8o12.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1.6 us of kernels per step" in r.stdout and "ours_kernel" in r.stdout
    assert_all_stopped(fake["pidfile"])


def test_gpu_profile_delay_profiles_while_the_rerun_runs(fake):
    """--gpu-profile-delay: the profile request goes out while the rerun's load is in flight (the fake
    server answers only once a request finished after it arrived, as SGLang does after its steps)."""
    # 200 tokens at the fake's 3 ms a step: each wave of the rerun takes ~0.6 s, so the profile
    # request lands 0.3 s into the first one.
    assert _run(fake, "gdn", "--only", "ours", "--gpu-profile-steps", "8", "--gpu-profile-delay", "0.3",
                "--output-len", "200", concs="2") == 0
    case = json.loads((fake["out"] / "cases" / "gdn__decode__ours__c2__i8o200.json").read_text())
    prof = case["gpu_profile"]
    assert "error" not in prof, prof
    assert prof["delay_s"] == 0.3 and prof["kernel_us"] == 12.5, prof
    (trace,) = (fake["out"] / "gpuprof").glob("*/*.trace.json.gz")
    with gzip.open(trace, "rt") as fh:
        assert json.load(fh)["fake_inflight_at_start"] > 0, "the profile must start inside the rerun's load"
    assert_all_stopped(fake["pidfile"])


def test_launch_max_running_requests_zero_leaves_the_flag_out(tmp_path):
    a = bs.parse_args(["--out", str(tmp_path), "--model", "gdn", "--launch-max-running-requests", "0"])
    info = dict(dir=str(tmp_path), kind="qwen3_next", weights="dummy", family="gdn")
    assert "--max-running-requests" not in bs._server_cmd(a, info, "ours", 30000)
    a = bs.parse_args(["--out", str(tmp_path), "--model", "gdn"])
    cmd = bs._server_cmd(a, info, "ours", 30000)
    assert cmd[cmd.index("--max-running-requests") + 1] == "1024"


def test_prefill_lines_from_an_h200_log():
    """`Prefill batch` lines as SGLang 0.5.17 printed them on the H200 (2026-11-30): the median input
    throughput counts the large back-to-back batches only."""
    log = "\n".join([
        "[2026-11-30 19:09:12] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, full token usage: 0.00, "
        "mamba usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 1.57",
        "[2026-11-30 19:09:16] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, full token usage: 0.02, "
        "mamba usage: 0.51, #running-req: 225, #queue-req: 0, #pending-token: 7680, cuda graph: False, "
        "input throughput (token/s): 80670.14",
        "[2026-11-30 19:09:16] Decode batch, #running-req: 1, #full token: 676, full token usage: 0.00, mamba num: 4, "
        "mamba usage: 0.00, accept len: 4.00, accept rate: 1.00, cuda graph: True, gen throughput (token/s): 37.55, "
        "#queue-req: 0",
        "[2026-11-30 19:09:16] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, full token usage: 0.02, "
        "mamba usage: 0.51, #running-req: 225, #queue-req: 0, #pending-token: 7680, cuda graph: False, "
        "input throughput (token/s): 85742.75",
        "[2026-11-30 19:09:17] Prefill batch, #new-seq: 15, #new-token: 7680, #cached-token: 0, full token usage: 0.02, "
        "mamba usage: 0.52, #running-req: 241, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 64478.74",
    ])
    assert bs.prefill_line_summary(log) == dict(prefill_batches=4, prefill_batches_large=3,
                                                prefill_input_tps_median=80670.14)
    assert bs.prefill_line_summary("")["prefill_input_tps_median"] is None


def test_run_order_stockplug_and_host_probe(fake, capsys):
    """--only sets the order the servers run in (a reversed second call shows whether running second
    changes a side); stockplug is stock's server with the plugins loaded; every case records the CPU
    seconds of the server's processes and of the busiest other processes over its timed window."""
    out = fake["out"]
    assert _run(fake, "gdn", "--only", "ours,stockplug,stock", concs="2") == 0
    printed = capsys.readouterr().out
    starts = [ln.split("]")[0].lstrip("[") for ln in printed.splitlines() if "sglang.launch_server" in ln]
    assert starts == ["ours", "stockplug", "stock"], starts
    servers = {p.stem: json.loads(p.read_text()) for p in (out / "servers").glob("*.json")}
    assert servers["gdn__decode__stockplug"]["sglang_plugins"] is None  # plugins loaded
    assert servers["gdn__decode__stock"]["sglang_plugins"] == bs.e2e.NO_PLUGINS
    assert "--mamba-backend triton" in shlex.join(servers["gdn__decode__stockplug"]["cmd"])
    cases = {p.stem: json.loads(p.read_text()) for p in (out / "cases").glob("*.json")}
    for side in ("ours", "stockplug", "stock"):
        c = cases[f"gdn__decode__{side}__c2__i8o12"]
        h = c["host"]
        assert c["side_order"] == ["ours", "stockplug", "stock"]
        assert h["wall_s"] > 0 and h["server_cpu_s"] >= 0 and h["cpus"] == os.cpu_count()
        assert all(r["server"] for r in h["server_top"]) and not any(r["server"] for r in h["other_top"])
        # this test process drove the load: counted as the client, neither server nor "other"
        assert os.getpid() not in [r["pid"] for r in h["server_top"] + h["other_top"]]
        assert h["client_cpu_s"] >= 0  # a fake case is too short for a 10 ms tick to show
    md = (out / "report.md").read_text()
    assert "stockplug/stock" in md and "Host CPU over each timed case" in md and "ours > stockplug > stock" in md
    assert "host: server CPU" in printed
    assert_all_stopped(fake["pidfile"])
    # one results folder holds one run of a side
    assert _run(fake, "gdn", "--only", "ours,ours", concs="2") == 2


def test_cpu_report_from_proc_stat_lines():
    stat = "4242 (python3 (sched) x) R 1 4200 4200 0 -1 4194304 10 0 0 0 150 50 0 0 20 0 12 0 100"
    st = bs.parse_proc_stat(stat)
    assert st == dict(comm="python3 (sched) x", state="R", ppid=1, pgid=4200, ticks=200)
    assert bs.parse_proc_stat("garbage") is None
    before = {1: dict(comm="a", pgid=9, ticks=100), 2: dict(comm="b", pgid=7, ticks=50),
              3: dict(comm="old", pgid=7, ticks=999)}
    after = {1: dict(comm="a", pgid=9, ticks=400), 2: dict(comm="b", pgid=7, ticks=60),
             3: dict(comm="new", pgid=7, ticks=30),  # pid reused: counted from zero
             4: dict(comm="c", pgid=5, ticks=0)}
    rep = bs.cpu_report(before, after, wall_s=2.0, server_pgid=7, ticks_per_s=100.0)
    assert rep["server_cpu_s"] == pytest.approx(0.4) and rep["other_cpu_s"] == pytest.approx(3.0)
    assert bs.cpu_report(before, after, 2.0, 7, 100.0, client_pid=1)["client_cpu_s"] == pytest.approx(3.0)
    assert bs.cpu_report(before, after, 2.0, 7, 100.0, client_pid=1)["other_top"] == []
    assert [r["pid"] for r in rep["server_top"]] == [3, 2]
    assert [r["pid"] for r in rep["other_top"]] == [1]  # idle processes are left out
    assert "busiest other process a (pid 1) 3.0 s" in bs.host_line(rep)
    assert rep["main_cpu_s"] == 0.0  # the group's leader (pid 7) is not among the processes
    assert bs.cpu_report(before, after, 2.0, None, 100.0)["main_cpu_s"] is None
    # the server's main process is the leader of its group: pid == pgid
    before[7], after[7] = dict(comm="python3", pgid=7, ticks=10), dict(comm="python3", pgid=7, ticks=170)
    rep = bs.cpu_report(before, after, wall_s=2.0, server_pgid=7, ticks_per_s=100.0)
    assert rep["main_cpu_s"] == pytest.approx(1.6) and rep["server_cpu_s"] == pytest.approx(2.0)
    assert bs.main_busy(rep) == pytest.approx(0.8) and "; main process 1.6 s" in bs.host_line(rep)
    assert rep["tokenizer_workers_cpu_s"] == [] and "tokenizer workers" not in bs.host_line(rep)
    # --tokenizer-worker-num 2: two workers of the group carry the HTTP load; the busiest one counts
    for pid, ticks in ((8, 190), (9, 120)):
        before[pid] = dict(comm="sglang::tokeni", pgid=7, ticks=0)
        after[pid] = dict(comm="sglang::tokeni", pgid=7, ticks=ticks)
    after[10] = dict(comm="sglang::tokeni", pgid=99, ticks=500)  # another server's worker: not ours
    rep = bs.cpu_report(before, after, wall_s=2.0, server_pgid=7, ticks_per_s=100.0)
    assert rep["tokenizer_workers_cpu_s"] == [pytest.approx(1.9), pytest.approx(1.2)]
    assert bs.main_busy(rep) == pytest.approx(0.95) and "; tokenizer workers 1.9 / 1.2 s" in bs.host_line(rep)


def test_report_notes_a_busy_server_main_process():
    """A side whose main process (HTTP server + tokenizer manager) ran >= MAIN_BUSY_NOTE of the case
    gets a note naming --stream-interval; the host table shows each side's main-process CPU."""
    cases = [_case("stock", 256, 100.0), _case("ours", 256, 110.0)]
    top = [dict(pid=5, comm="sglang::schedul", cpu_s=10.0, server=True)]
    cases[0]["host"] = dict(wall_s=10.0, server_cpu_s=20.0, main_cpu_s=7.9, server_top=top, other_top=[])
    cases[1]["host"] = dict(wall_s=10.0, server_cpu_s=20.0, main_cpu_s=8.2, server_top=top, other_top=[])
    md = bs.markdown_report(cases, [], [])
    assert "ours C=256: the server's main process (HTTP server and tokenizer manager) was busy 82%" in md
    assert "--stream-interval N" in md and "stock C=256: the server's main process" not in md
    assert "| stock | 256 | - | 10.0 | 20.00 | 7.90 (79%) | sglang::schedul 10.00 |" in md
    del cases[1]["host"]["main_cpu_s"]  # cases from before the column: no note, a dash
    md = bs.markdown_report(cases, [], [])
    assert "the server's main process" not in md
    assert "| ours | 256 | - | 10.0 | 20.00 | - | sglang::schedul 10.00 |" in md
    # tokenizer workers: the busiest of them is what the note weighs, and the cell lists them
    cases[0]["host"].update(main_cpu_s=0.5, tokenizer_workers_cpu_s=[8.5, 3.0])
    md = bs.markdown_report(cases, [], [])
    assert "stock C=256: the server's busiest HTTP/tokenizer process was busy 85%" in md
    assert "| stock | 256 | - | 10.0 | 20.00 | 0.50 / 8.50 / 3.00 (85%) |" in md


def _synthetic_trace(path, gaps, extra=()):
    """A torch-profiler-like trace: launches of kernels k0, k1, ... with the given host gaps (us)
    between consecutive launches, each kernel 5 us on the GPU; `extra` = (index, name) launches
    only this side makes."""
    events, t = [], 0.0
    names = [f"k{i}" for i in range(len(gaps))]  # aperiodic: difflib may shift a periodic one by periods
    for i, name in extra:
        names.insert(i, name)
        gaps.insert(i, 10.0)
    for i, (name, gap) in enumerate(zip(names, gaps)):
        events.append(dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=t, dur=3.0,
                           args=dict(correlation=i)))
        events.append(dict(ph="X", cat="kernel", name=name, ts=t + 4.0, dur=5.0, args=dict(correlation=i)))
        t += gap
    with gzip.open(path, "wt") as fh:
        json.dump(dict(traceEvents=events), fh)


def test_trace_gaps_tells_uniform_slowdown_from_one_pause(tmp_path):
    tg = load_script("diag/trace_gaps")
    n = 400
    _synthetic_trace(tmp_path / "a.json.gz", [50.0] * n)
    _synthetic_trace(tmp_path / "uniform.json.gz", [60.0] * n, extra=[(100, "only_b")])
    pause = [50.0] * n
    pause[201] = 50.0 + 2000.0  # one 2 ms pause after the launch of k201
    _synthetic_trace(tmp_path / "pause.json.gz", pause)
    a = tg.api_calls(tg.load_events(str(tmp_path / "a.json.gz")))
    u = tg.compare(a, tg.api_calls(tg.load_events(str(tmp_path / "uniform.json.gz"))))
    p = tg.compare(a, tg.api_calls(tg.load_events(str(tmp_path / "pause.json.gz"))))
    assert u["aligned"] == n and p["aligned"] == n
    assert u["median_gap_ratio"] == pytest.approx(1.2) and u["big_gaps"] == 0
    assert u["diff_in_small_gaps_us"] == pytest.approx(10.0 * (n - 1))  # the last call has no next
    assert u["only_b"][0][0] == "cudaLaunchKernel|only_b"
    assert p["median_gap_ratio"] == pytest.approx(1.0) and p["big_gaps"] == 1
    assert p["diff_in_big_gaps_us"] == pytest.approx(2000.0)
    (x, y), (count, sa, sb) = p["pairs"][0]
    assert x == "cudaLaunchKernel|k201" and y == "cudaLaunchKernel|k202" and sb - sa == pytest.approx(2000.0)
    r = subprocess.run([sys.executable, str(Path(bs.__file__).parent / "diag" / "trace_gaps.py"),
                        str(tmp_path / "a.json.gz"), str(tmp_path / "pause.json.gz")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "in 1 gaps that changed by > 200 us: +2.0 ms" in r.stdout



def test_diag_per_step_diff(tmp_path):
    """scripts/diag/summarize.py --diff: microseconds per step per side, A - B first."""
    def side(name, loop, commit, steps_s):
        d = tmp_path / name
        d.mkdir()
        thread = dict(samples=loop, incl=[["scheduler.py:1:event_loop_overlap", loop], ["commit.py:2:commit", commit]],
                      self=[["commit.py:2:commit", commit]])
        (d / "1.json").write_text(json.dumps(dict(pid=1, threads={"MainThread": thread}, process=None)))
        return f"{name}={d}"

    a, b = side("ours", 9.5, 1.2, 0), side("stock", 8.0, 0.9, 0)
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "diag" / "summarize.py"),
                        a, b, "--diff", "ours,stock", "--steps", "ours=1000,stock=500"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    incl = lines[lines.index(next(x for x in lines if x.startswith("== incl"))) + 1:]
    # per step: loop 9500 vs 16000 us, commit 1200 vs 1800 us; sorted by ours - stock, largest first
    assert incl[0].split() == ["-600", "1200", "1800", "commit.py:2:commit"]
    assert incl[1].split() == ["-6500", "9500", "16000", "scheduler.py:1:event_loop_overlap"]
    bad = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "diag" / "summarize.py"),
                          a, b, "--diff", "ours,stock", "--steps", "ours=1000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no step count for stock" in bad.stderr


def test_stream_generate_counts_the_stream(tmp_path):
    """A local server answering like SGLang's streaming /generate (chunked SSE, cumulative output
    ids, e2e_latency in the last event): tokens, payload bytes and the server's latency."""
    import asyncio
    import json

    events = [{"output_ids": list(range(k)), "meta_info": {"completion_tokens": k}} for k in (1, 2, 3)]
    events[-1]["meta_info"].update(e2e_latency=0.25, finish_reason={"type": "length"})
    payloads = [json.dumps(e).encode() for e in events] + [b"[DONE]"]

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for p in payloads:
            chunk = b"data: " + p + b"\n\n"
            writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await bs.stream_generate("127.0.0.1", port, {"input_ids": [1, 2], "stream": True})

    rec = asyncio.run(main())
    assert rec["ok"] and rec["error"] is None and rec["output_tokens"] == 3 and rec["finish_reason"] == "length"
    assert rec["stream_bytes"] == sum(len(p) for p in payloads[:-1])
    assert rec["server_e2e_s"] == pytest.approx(0.25)
    assert rec["output_digest"] == bs.output_digest([0, 1, 2]) != bs.output_digest([0, 1, 3])


def test_greedy_agreement_request_by_request():
    d = bs.output_digest
    stock = _case("stock", 4, 100.0)
    ours = _case("ours", 4, 150.0)
    up = _case("upstream", 4, 120.0)
    stock["output_digests"] = [d([1, 2]), d([3, 4]), d([5, 6]), None]
    ours["output_digests"] = [d([1, 2]), d([3, 9]), d([5, 6]), d([7, 8])]  # the 2nd differs; the 4th has no pair
    up["output_digests"] = [d([1, 2]), d([3, 4])]                             # fewer requests: compared as far as both go
    group = {"stock": {4: stock}, "ours": {4: ours}, "upstream": {4: up}}
    assert bs.greedy_agreement(group) == ["ours C=4: 2 of 3 requests generated the same tokens as stock",
                                          "upstream C=4: 2 of 2 requests generated the same tokens as stock"]
    assert bs.greedy_agreement({"ours": {4: ours}}) == []  # no stock side: nothing to compare
    md = bs.markdown_report([stock, ours], [], [])
    assert "Greedy tokens, request by request: ours C=4: 2 of 3 requests generated the same tokens as stock." in md


def test_ours_side_stops_before_any_server_without_the_plugin(fake, tmp_path, capsys):
    """An interpreter that cannot load our plugin: the run stops before building or starting
    anything when ours is on the list, and goes on without ours."""
    py = python_without_plugin(tmp_path, tmp_path / "fake_server.py")
    rc = _run(fake, "gdn", "--python", py, "--only", "stock,ours", concs="1")
    assert rc == 2
    assert "ours side: --mamba-backend replayssm needs the sglang-replayssm plugin" in capsys.readouterr().err
    assert not fake["pidfile"].exists() and not (fake["out"] / "cases").exists()
    assert _run(fake, "gdn", "--python", py, "--only", "stock", concs="1") == 0


def test_spec_steps_keeps_only_clean_decode_steps(tmp_path):
    """scripts/diag/spec_steps.py: steps found by their per-layer marker kernel; a step with a
    prefill kernel, or with another count of markers, is left out of the per-step kernel time."""
    ss = load_script("diag/spec_steps")
    ev, t = [], 0.0

    def k(name, dur):
        nonlocal t
        ev.append(dict(ph="X", cat="kernel", name=name, ts=t, dur=dur))
        t += dur + 1.0

    plan = ["clean", "prefill", "clean", "short", "clean", "clean"]  # the last one has no end: dropped
    for what in plan:
        for _ in range(3 if what != "short" else 2):
            k("_gdn_verify_fused_kernel", 10.0)
            k("gemm", 5.0)
        if what == "prefill":
            k("chunk_gated_delta_rule_fwd_kernel_h", 100.0)
        k("attn", 20.0)
        t += 5000.0  # the host's gap between steps
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": ev + [dict(ph="X", cat="cpu_op", name="x", ts=0, dur=1)]}, fh)
    kern = ss.kernels(str(path))
    assert ss.pick_marker(kern) == "_gdn_verify_fused_kernel"
    steps = ss.decode_steps(kern, "_gdn_verify_fused_kernel", layers=3, gap_us=3000)
    assert len(steps) == 3  # steps 0, 2 and 4
    tot = ss.step_kernels(kern, steps)
    assert tot == {"_gdn_verify_fused_kernel": 90.0, "gemm": 45.0, "attn": 60.0}
    r = subprocess.run([sys.executable, str(Path(bs.__file__).parent / "diag" / "spec_steps.py"), str(path),
                        "--layers", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 clean decode steps" in r.stdout and "kernels 65 us" in r.stdout
    r = subprocess.run([sys.executable, str(Path(bs.__file__).parent / "diag" / "spec_steps.py"), str(path),
                        "--layers", "3", "--prefill", "no_such_kernel"], capture_output=True, text=True)
    assert r.returncode == 0 and "4 clean decode steps" in r.stdout  # the prefill step counts now
