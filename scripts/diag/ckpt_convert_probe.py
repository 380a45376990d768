"""Time the split-checkpoint layout conversions (replayssm_kernels/gdn/ckpt.py) on the GPU: the
first call of each variant (compile + run) and steady runs, for a whole pool and for one layer's
extend-batch slots. No SGLang needed.

    PYTHONPATH=triton_kernels python scripts/diag/ckpt_convert_probe.py --layers 24 --slots 300
"""

import argparse
import time

import torch

from replayssm_kernels.gdn.ckpt import split_ckpt_convert, split_ckpt_encode


def timed(fn, reps=1):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--slots", type=int, default=300)
    p.add_argument("--hv", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    a = p.parse_args()
    state = torch.randn(a.layers, a.slots, a.hv, 128, 128, device="cuda")
    ref = state[:, :4].clone()
    gb = state.numel() * 4 / 1e9
    rows = torch.arange(a.batch, dtype=torch.int32, device="cuda")
    out = {}
    out["pool_to_split_first_s"] = timed(lambda: split_ckpt_convert(state, None, True))
    out["pool_to_fp32_first_s"] = timed(lambda: split_ckpt_convert(state, None, False))
    out["layer_rows_to_split_first_s"] = timed(lambda: split_ckpt_convert(state[0], rows, True))
    out["layer_rows_to_fp32_first_s"] = timed(lambda: split_ckpt_convert(state[0], rows, False))
    out["pool_roundtrip_s"] = timed(lambda: (split_ckpt_convert(state, None, True),
                                             split_ckpt_convert(state, None, False)), reps=3)
    out["pool_GBps_per_direction"] = 2 * gb / (out["pool_roundtrip_s"] / 2)
    out["layer_rows_roundtrip_us"] = 1e6 * timed(lambda: (split_ckpt_convert(state[0], rows, True),
                                                          split_ckpt_convert(state[0], rows, False)), reps=20)
    split_ckpt_convert(state, None, True)
    enc_ok = torch.equal(state[:, :4].view(torch.int32), split_ckpt_encode(ref).view(torch.int32))
    split_ckpt_convert(state, None, False)
    out["exact"] = enc_ok and torch.equal(state[:, :4].view(torch.int32), ref.view(torch.int32))
    out["pool_GB"] = gb
    print(torch.cuda.get_device_name())
    for k, v in out.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
