"""Per-request hybrid-state memory and the concurrency it allows: stock SGLang 0.5.17 vs ReplaySSM.

    python scripts/memory_model.py [--budget-gib 40] [--ring-len 16] [--draft-tokens 4] [--json OUT]

CPU only, no weights. For each real model shape it writes a config-only checkpoint with
`make_tiny_model.py --no-weights`, asks SGLang 0.5.17 for the model's own `mamba2_cache_params`
(the object its memory solver reads) and asks the plugin for the ring bytes its solver charges
(`sglang_replayssm.pool.ring_bytes_per_slot`), per SSM layer, then scales to the real number of
SSM layers. It reports, per request:

* stock without speculative decoding: `mamba_cache_per_req` (SSM state + conv state);
* stock with NEXTN/EAGLE (`D` draft tokens): SGLang reserves `D * mamba_cache_per_req` of
  `intermediate_ssm` per running request on top (kv_cache_configurator.py L1870-L1945);
* ours: `mamba_cache_per_req + rings + cursors`; no `intermediate_ssm`;
* SGLang's own `--enable-linear-replayssm-spec` (GDN only): `mamba_cache_per_req` plus its fold
  window of `D` raw inputs, `replayssm_ring_bytes_per_req(record_len=D)` (SGLang's own count, the
  one its solver charges); no `intermediate_ssm` either.

and the largest number of running requests whose hybrid state fits `--budget-gib`:

* radix cache off (`--disable-radix-cache`): one slot per running request, +1 padding slot on
  every buffer;
* radix cache on: SGLang keeps `--mamba-ratio` slots per running request (5 by default: 3, plus 2
  ping-pong slots of the default `extra_buffer` strategy with the overlap scheduler,
  `_calculate_mamba_ratio`), and sizes stock spec by its joint solve
  `K = (M - per_req (1 + D)) / (per_req (1 + D / ratio))`, ours and SGLang's own spec by
  `K = (M - per_slot) / per_slot`; running requests = `K / ratio`. These are byte counts from SGLang's and our sizing code, not a GPU measurement;
the KV cache or activations may bind first on a real server (docs/serving.md measures that).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "triton_kernels"))

# name: (make_tiny_model flags at a few layers, family, real SSM layer count, description)
MODELS = {
    "qwen3-next-80b": (["--preset", "qwen3_next", "--shape", "qwen3-next-80b", "--num-layers", "4"], "gdn", 36,
                       "Qwen3-Next-80B-A3B (48 layers: 36 GDN, HV=32, H=16, K=V=128)"),
    "nemotron-nano-9b-v2": (["--preset", "nemotron_h", "--shape", "nemotron-nano-9b-v2", "--pattern", "M-M*"],
                            "mamba2", 27, "Nemotron-Nano-9B-v2 (27 Mamba-2 layers, NH=128, P=80, N=128, G=8)"),
    "nemotron-3-super": (["--preset", "nemotron_h", "--shape", "nemotron-3-super", "--pattern", "MEM*E"],
                         "mamba2", 40, "Nemotron-3-Super (40 Mamba-2 layers, NH=128, P=64, N=128, G=8)"),
}
_MIB = float(1 << 20)


def per_layer_bytes(flags: list[str], family: str, ring_len: int, draft: int) -> dict:
    import torch
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils.hf_transformers import get_config

    from sglang_replayssm.pool import CURSOR_BYTES_PER_SLOT, ring_bytes_per_slot

    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, str(HERE / "make_tiny_model.py"), *flags, "--no-weights", "--out", d],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"make_tiny_model failed: {r.stderr[-2000:]}")
        cfg = get_config(d, trust_remote_code=False)
        with get_parallel().override(attn_tp_size=1):
            params = cfg.get_text_config().mamba2_cache_params
    n = len(params.layers)
    return {
        "state_conv": params.mamba_cache_per_req / n,
        "rings": ring_bytes_per_slot(family, params, ring_len, torch.bfloat16, 1),
        "cursors": CURSOR_BYTES_PER_SLOT,
        "upstream_spec_rings": params.replayssm_ring_bytes_per_req(record_len=draft) / n if family == "gdn" else None,
    }


def model_rows(budget_gib: float, ring_len: int, draft: int, ratio: int = 5) -> list[dict]:
    budget = budget_gib * (1 << 30)
    rows = []
    for name, (flags, family, layers, desc) in MODELS.items():
        b = per_layer_bytes(flags, family, ring_len, draft)
        state = b["state_conv"] * layers
        stock = state
        stock_spec = state * (1 + draft)
        ours = state + b["rings"] * layers + b["cursors"]
        fit = lambda per_req: int(budget // per_req) - 1  # noqa: E731  (+1 padding slot)
        radix_stock_spec = int((budget - state * (1 + draft)) // (state * (1 + draft / ratio))) // ratio
        radix_fit = lambda per_slot: int((budget - per_slot) // per_slot) // ratio  # noqa: E731  (one slot a solve)
        up_rings = None if b["upstream_spec_rings"] is None else b["upstream_spec_rings"] * layers
        rows.append(dict(
            model=name, desc=desc, family=family, ssm_layers=layers, ring_len=ring_len, draft_tokens=draft,
            state_conv_mib=state / _MIB, intermediate_ssm_mib=state * draft / _MIB,
            rings_mib=b["rings"] * layers / _MIB, stock_mib=stock / _MIB, stock_spec_mib=stock_spec / _MIB,
            ours_mib=ours / _MIB, fit_stock=fit(stock), fit_stock_spec=fit(stock_spec), fit_ours=fit(ours),
            mamba_ratio=ratio, radix_fit_stock_spec=radix_stock_spec, radix_fit_ours=radix_fit(ours),
            upstream_spec_rings_mib=None if up_rings is None else up_rings / _MIB,
            fit_upstream_spec=None if up_rings is None else fit(state + up_rings),
            radix_fit_upstream_spec=None if up_rings is None else radix_fit(state + up_rings),
        ))
    return rows


def markdown(rows: list[dict], budget_gib: float) -> str:
    out = [f"| model | per request: state + conv (MiB) | stock spec: + intermediate_ssm (MiB) | ours: + rings "
           f"(MiB) | SGLang's own spec: + rings (MiB) | radix off, requests in {budget_gib:g} GiB: stock / stock "
           f"spec / SGLang's own spec / ours | ours vs stock spec | radix on (ratio {rows[0]['mamba_ratio']}): stock "
           f"spec / SGLang's own spec / ours | ours vs stock spec |",
           "|---|---:|---:|---:|---:|---|---:|---|---:|"]
    na = lambda v, fmt="{}": "-" if v is None else fmt.format(v)  # noqa: E731  (Mamba-2: no SGLang own path)
    for r in rows:
        out.append(f"| {r['desc']} | {r['state_conv_mib']:.1f} | {r['intermediate_ssm_mib']:.1f} (T={r['draft_tokens']}) "
                   f"| {r['rings_mib']:.2f} (L={r['ring_len']}) | {na(r['upstream_spec_rings_mib'], '{:.2f}')} "
                   f"| {r['fit_stock']} / {r['fit_stock_spec']} / {na(r['fit_upstream_spec'])} / {r['fit_ours']} "
                   f"| {r['fit_ours'] / r['fit_stock_spec']:.2f}x | {r['radix_fit_stock_spec']} / "
                   f"{na(r['radix_fit_upstream_spec'])} / {r['radix_fit_ours']} "
                   f"| {r['radix_fit_ours'] / r['radix_fit_stock_spec']:.2f}x |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-gib", type=float, default=40.0, help="GPU memory given to the hybrid state")
    p.add_argument("--ring-len", type=int, default=16)
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--mamba-ratio", type=int, default=5, help="slots per running request with the radix cache on")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = model_rows(a.budget_gib, a.ring_len, a.draft_tokens, a.mamba_ratio)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows, a.budget_gib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
