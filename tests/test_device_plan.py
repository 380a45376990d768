"""scripts/device_plan.sh: every command a step would run on the GPU machine parses with the
script it calls (a wrong flag costs a device call: session 9 lost one to `--years 24`)."""

import argparse
import os
import re
import shlex
import subprocess
import sys

import pytest

from replayssm_kernels.configs import parse_plan
from script_loader import ROOT, load_script

STEPS = ["install", "kernels", "m2_profile", "m2_sweep", "gdn_profile", "gdn_kc", "gdn_rt", "gdn_shfl", "gdn_dot",
         "gdn_order", "gdn_pdl", "gdn_prep", "gdn_plan4", "gdn_vloop", "gdn_vsmall", "gdn_vtiers", "gdn_ring32", "gdn_dflush", "gdn_small", "gdn_sweep", "e2e320", "e2e_dispatch", "e2e_prefix", "spec_c1", "decode_c1", "spec_fit",
         "spec_fit2", "decode_fixed", "spec256", "decode_prof", "aime", "gdn_ncu", "jit_cache_pack"]
CASE = re.compile(r"^(qwen3_next|nemotron_h)((:(nextn|ring|radix|nobuffer|retract|mixed))*)$")


def _dry(tmp_path, *steps):
    env = {**os.environ, "DRY": "1", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(ROOT / "scripts" / "device_plan.sh"), *steps], capture_output=True,
                          text=True, env=env, timeout=120)


def _commands(stdout):
    out = []
    for line in stdout.splitlines():
        if line.startswith("+ (background) "):
            out.append(shlex.split(line[len("+ (background) "):]))
        elif line.startswith("+ "):
            out.append(shlex.split(line[2:]))
    return out


def test_every_step_command_parses(tmp_path, monkeypatch):
    r = _dry(tmp_path, *STEPS)
    assert r.returncode == 0, r.stderr
    cmds = _commands(r.stdout)
    bs = load_script("bench_serving")
    aime = load_script("aime_parity")
    fit = load_script("fit_probe")
    e2e = load_script("e2e_parity")
    seen = {"bench": 0, "aime": 0, "e2e": 0, "fit": 0, "kernels": 0}
    import argparse

    from sglang.srt.server_args import ServerArgs

    sglang_parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(sglang_parser)
    for cmd in cmds:
        joined = " ".join(cmd)
        if "scripts/bench_serving.py" in cmd:
            args = cmd[cmd.index("scripts/bench_serving.py") + 1:]
            a = bs.parse_args(args)  # exits (SystemExit) on an unknown flag or a bad value
            sides = a.only.split(",")
            assert set(sides) <= set(bs.STUDY_SIDES[a.study]) and len(set(sides)) == len(sides), joined
            # The extra server flags, with SGLang's own parser (a typo there costs a device call;
            # the full argument checks of every side's command are in test_bench_serving_logic).
            for extra in (a.server_args, a.stock_args, a.ours_args, a.upstream_args):
                if extra:
                    sglang_parser.parse_args(["--model-path", "m", *shlex.split(extra)])
            seen["bench"] += 1
        elif "scripts/fit_probe.py" in cmd:
            a = fit.parse_args(cmd[cmd.index("scripts/fit_probe.py") + 1:])
            assert a.side_list in (["stock", "ours"], ["stock"], ["ours"]), joined
            assert a.models_dir == "/tmp/bench_models", joined
            seen["fit"] += 1
        elif "scripts/aime_parity.py" in cmd:
            aime.parse_args(cmd[cmd.index("scripts/aime_parity.py") + 1:])
            seen["aime"] += 1
        elif "scripts/device_kernels.sh" in cmd:
            assert cmd[-1] in ("tests", "gdntests", "bench", "m2profile", "profile", "pdlprobe", "ncu") and any(x.startswith("OUT=") for x in cmd), joined
            prof_args = [x[len("GDNPROFILE_ARGS="):] for x in cmd if x.startswith("GDNPROFILE_ARGS=")]
            if prof_args:  # parsed (and its plans checked) by the profiler's own parser
                load_script("profile_gdn_phases").parse_args(["--batch", "256", "--ceiling", *shlex.split(prof_args[0])])
            for cfg in (x[len("REPLAYSSM_CONFIG="):] for x in cmd if x.startswith("REPLAYSSM_CONFIG=")):
                for item in cfg.split(","):  # what configs._env_overrides would refuse on the GPU
                    name, _, val = item.partition("=")
                    assert parse_plan(name, val) is not None, f"REPLAYSSM_CONFIG entry {item!r} in {joined}"
            for probe_args in (x[len("PDLPROBE_ARGS="):] for x in cmd if x.startswith("PDLPROBE_ARGS=")):
                load_script("pdl_probe").parse_args(shlex.split(probe_args))
            for ncu_args in (x[len("NCU_ARGS="):] for x in cmd if x.startswith("NCU_ARGS=")):
                load_script("ncu_gdn_decode").parse_args(shlex.split(ncu_args))
            bench_args = [x[len("BENCH_ARGS="):] for x in cmd if x.startswith("BENCH_ARGS=")]
            if bench_args:
                # bench_kernels parses its flags before it asks for a GPU: on the CPU a good command
                # stops at the GPU check, a bad flag at argparse (exit status 2).
                bk = load_script("bench_kernels")
                with pytest.raises(SystemExit) as e:
                    bk.main(shlex.split(bench_args[0]))
                assert "needs a CUDA GPU" in str(e.value.code), joined
            seen["kernels"] += 1
        elif "scripts/device_e2e.sh" in cmd:
            i = cmd.index("scripts/device_e2e.sh")
            assert cmd[i + 1] in ("install", "run"), joined
            for case in cmd[i + 2:]:
                assert CASE.match(case), f"bad e2e case {case!r} in {joined}"
            driver = [x[len("E2E_DRIVER_FLAGS="):] for x in cmd if x.startswith("E2E_DRIVER_FLAGS=")]
            if driver:  # extra e2e_parity.py flags: parsed with the driver's own parser
                e2e.parse_args(["--model", "m", *shlex.split(driver[0])])
            seen["e2e"] += 1
    assert seen == {"bench": 9, "aime": 1, "e2e": 5, "fit": 3, "kernels": 57}, seen


def _serving_args(tmp_path, *steps):
    """bench_serving's parsed arguments for every bench_serving command the steps would run."""
    bs = load_script("bench_serving")
    r = _dry(tmp_path, *steps)
    assert r.returncode == 0, r.stderr
    return [bs.parse_args(cmd[cmd.index("scripts/bench_serving.py") + 1:])
            for cmd in _commands(r.stdout) if "scripts/bench_serving.py" in cmd]


def test_sides_knobs_reach_the_serving_commands(tmp_path, monkeypatch):
    """DECODE_SIDES / SPEC_SIDES put SGLang's own ReplaySSM (`upstream`) beside stock and ours in the
    fixed-pool studies; the default stays stock and ours."""
    def sides(extra):
        for k in ("DECODE_SIDES", "SPEC_SIDES", "DECODE_MODELS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in extra.items():
            monkeypatch.setenv(k, v)
        got = []
        for a in _serving_args(tmp_path, "decode_fixed", "spec256"):
            got.append((a.study, a.model, a.only))
            upstream_args.append(a.upstream_args)
        return got

    upstream_args = []
    assert sides({}) == [("decode", "gdn", "stock,ours"), ("decode", "nano9b", "stock,ours"),
                         ("spec", "gdn", "stock,ours")]
    assert upstream_args == ["", "", ""]
    upstream_args.clear()
    assert sides({"DECODE_SIDES": "stock,upstream,ours", "SPEC_SIDES": "upstream,ours", "DECODE_MODELS": "gdn"}) == [
        ("decode", "gdn", "stock,upstream,ours"), ("spec", "gdn", "upstream,ours")]
    # SGLang's own decode side runs with its rings' share of the GPU off its fraction (session 24:
    # at the auto 0.907 it died of a CUDA OOM on its first 256 prefills).
    assert upstream_args == ["--mem-fraction-static=0.825"] * 2
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    assert parser.parse_args(["--model-path", "m", *shlex.split(upstream_args[0])]).mem_fraction_static == 0.825


def test_spec_conc_and_args_reach_the_spec_command(tmp_path, monkeypatch):
    """SPEC_CONC / SPEC_ARGS set the spec study's concurrencies and extra flags (e.g. a longer output,
    so that the decode steps outweigh the prefill waves); without them the study keeps 256,128 at
    bench_serving's default output length."""
    bs = load_script("bench_serving")

    def spec(extra):
        for k in ("SPEC_CONC", "SPEC_ARGS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in extra.items():
            monkeypatch.setenv(k, v)
        (a,) = _serving_args(tmp_path, "spec256")
        return a

    default_out = bs.parse_args(["--model", "gdn", "--out", str(tmp_path / "b")]).output_len
    a = spec({})
    assert (a.concurrency, a.output_len) == ("256,128", default_out)
    a = spec({"SPEC_CONC": "256", "SPEC_ARGS": "--output-len 1024"})
    assert (a.concurrency, a.output_len, a.study) == ("256", 1024, "spec")


def test_prof_args_and_tag_reach_the_decode_prof_command(tmp_path, monkeypatch):
    """PROF_ARGS adds bench_serving flags to decode_prof (e.g. another attention backend) and
    PROF_TAG moves its results to their own folder."""
    for k in ("PROF_ARGS", "PROF_TAG", "PROF_SIDES", "PROF_POOL_ARGS"):
        monkeypatch.delenv(k, raising=False)
    (a,) = _serving_args(tmp_path, "decode_prof")
    assert a.attention_backend is None and a.out == "/tmp/b_prof_gdn"
    monkeypatch.setenv("PROF_ARGS", "--attention-backend flashinfer")
    monkeypatch.setenv("PROF_TAG", "_fi")
    (a,) = _serving_args(tmp_path, "decode_prof")
    assert (a.attention_backend, a.out, a.concurrency, a.study) == ("flashinfer", "/tmp/b_prof_gdn_fi", "256", "decode")
    assert a.pack.endswith("decode_prof_gdn_fi.tgz")


def test_ncu_args_reach_the_gdn_ncu_command(tmp_path, monkeypatch):
    """gdn_ncu runs device_kernels.sh's ncu part with NCU_ARGS passed through (a plan to profile)."""
    monkeypatch.setenv("NCU_ARGS", "--plan 3x16x1x3x8x0x1 --steps 8")
    r = _dry(tmp_path, "gdn_ncu")
    assert r.returncode == 0, r.stderr
    (cmd,) = [c for c in _commands(r.stdout) if "scripts/device_kernels.sh" in c]
    assert cmd[-1] == "ncu" and "NCU_ARGS=--plan 3x16x1x3x8x0x1 --steps 8" in cmd
    a = load_script("ncu_gdn_decode").parse_args(shlex.split(cmd[cmd.index("NCU_ARGS=--plan 3x16x1x3x8x0x1 --steps 8")]
                                                                [len("NCU_ARGS="):]))
    assert (a.plan, a.steps, a.batch) == ("3x16x1x3x8x0x1", 8, 256)


def test_qwen35_4b_and_pool_knobs_reach_the_serving_commands(tmp_path, monkeypatch):
    """DECODE_MODELS=qwen35_4b and SPEC_MODEL=qwen35_4b run the dense Qwen3.5-4B look-alike with the
    gdn model's pools; DECODE_POOL_ARGS replaces a model's pool flags (an H100 does not hold 1300
    slots of 24 GDN layers)."""
    for k in ("DECODE_SIDES", "SPEC_SIDES", "DECODE_POOL_ARGS", "SPEC_POOL_ARGS"):
        monkeypatch.delenv(k, raising=False)

    def cmds(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return [(a.study, a.model, a.server_args) for a in _serving_args(tmp_path, "decode_fixed", "spec256")]

    gdn_pool = "--max-mamba-cache-size 1300 --max-running-requests 256"
    assert cmds(DECODE_MODELS="qwen35_4b", SPEC_MODEL="qwen35_4b") == [
        ("decode", "qwen35_4b", gdn_pool), ("spec", "qwen35_4b", gdn_pool)]
    small = "--disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256"
    assert cmds(DECODE_MODELS="qwen35_4b gdn", DECODE_POOL_ARGS=small)[:2] == [
        ("decode", "qwen35_4b", small), ("decode", "gdn", small)]
    monkeypatch.setenv("DECODE_MODELS", "qwen3_5")
    r = _dry(tmp_path, "decode_fixed")
    assert r.returncode != 0 and "qwen35_4b" in r.stderr


def test_unknown_step_is_refused(tmp_path):
    r = _dry(tmp_path, "spec_c1", "nonsense")
    assert r.returncode == 2 and "unknown step nonsense" in r.stderr
    assert _dry(tmp_path).returncode == 2


def test_a_bad_flag_would_be_caught():
    """The check above can fail: the session-9 AIME command is refused by the parser."""
    aime = load_script("aime_parity")
    with pytest.raises(SystemExit):
        aime.parse_args(["--data-dir", ".aime_data", "--model", "m", "--years", "24"])
