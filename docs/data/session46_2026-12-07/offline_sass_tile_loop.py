"""Session 46, offline (no GPU): registers, spills and per-loop SASS opcode counts of GDN decode plan 5
as served (split checkpoints, bf16 activations, flush capacity), with and without its tensor-core form.

    cd <repo> && PYTHONPATH=triton_kernels:. CAP=96 python docs/data/session46_2026-12-07/offline_sass_tile_loop.py DOT=1

CAP: the register cap (default 96, 0 = none); DOT=0|1 replaces that compile-time argument. Prints
(registers, spill store bytes, spill load bytes), shared memory, the whole kernel's instruction count,
then each loop body's count and its most frequent opcodes; the non-flush tile loop is the one with
the LDSM/HMMA (tensor cores) or the 128 SHFL (warp reductions).
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
import kernel_regs as kr  # noqa: E402
from replayssm_kernels.configs import gdn_decode_config, gdn_k_tree  # noqa: E402
from replayssm_kernels.gdn import verify_loop  # noqa: E402
from replayssm_kernels.gdn.decode import plan5_constexprs  # noqa: E402

H, HV, K, V, L = 16, 32, 128, 128, 16
cfg = gdn_decode_config(K, V, rows=256, split_ckpt=True)
kern = verify_loop._gdn_decode_loop_kernel
tree = gdn_k_tree(K)
ptrs = {**kr.gdn_pointers(), "ring_fk": "*fp32" if tree else "*bf16", "ring_kn": "*fp32", "ring_kraw": "*bf16",
        "row_order": "*i32", "flush_index": "*i32"}
cv = plan5_constexprs(cfg, H, HV, K, V, L, tree=tree, split=True, half=True, ordered=True, raw_k=not tree, capped=True)
cv.update({k: int(v) for k, v in (a.split("=") for a in sys.argv[1:])})
sig = kr.signature(kern, ptrs, cv)
comp = kr.compile_variant(kern, sig, cv, cfg.num_warps, cfg.launch_stages, maxnreg=int(os.environ.get("CAP", "96")))
print(cfg.key(), "DOT", cv.get("DOT"))
print(kr.ptxas_report(kern, sig, cv, cfg.num_warps, compiled=comp), comp.metadata.shared)
print("total", kr.sass_ops(comp.asm["cubin"])[0])
for n, ops in kr.sass_loops(comp.asm["cubin"]):
    print(n, sorted(ops.items(), key=lambda x: -x[1])[:14])
