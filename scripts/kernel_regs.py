"""Registers and spills of the ReplaySSM kernels for sm_90, without a GPU.

    python scripts/kernel_regs.py            # GDN launch plans at the Qwen3-Next head shape,
                                             # then the Mamba-2 decode plans at the Super shape
    python scripts/kernel_regs.py --shuffle-form   # the GDN shuffle-form replay kernels: JSON lines
                                                   # with shfl counts and inline-asm operand layouts
    python scripts/kernel_regs.py --replay-loop    # SASS of the GDN fold's replay loop per form
    python scripts/kernel_regs.py --state-launch   # SASS of the GDN verify's state launch per plan
    python scripts/kernel_regs.py --pdl            # the GDN prep/state pair with and without PDL:
                                                   # griddepcontrol, and the checkpoint loads that
                                                   # come before the state launch's wait

Compiles each kernel variant with Triton for `cuda:90` (no device needed) and runs the `ptxas`
that ships with Triton (`-v`) on the PTX: registers per thread and spill bytes. One warp-wide
program at 255 registers leaves room for 8 resident warps per SM; spills go through local memory.
Use it to screen launch plans before spending device time (docs/perf.md has the last table).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import replace

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
TARGET = GPUTarget("cuda", 90, 32)


def compile_variant(kernel, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 3, maxnreg=None):
    """One variant compiled for sm_90, specialised as a launch specialises it (`divisibility_attrs`);
    `maxnreg` as a launch's register cap (PTX `.maxnreg`)."""
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=divisibility_attrs(kernel, signature))
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=TARGET, options=options)


def ptxas_report(kernel, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 3, compiled=None):
    """(registers, spill store bytes, spill load bytes) of one compiled variant."""
    if compiled is None:
        compiled = compile_variant(kernel, signature, constexprs, num_warps, num_stages)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    out = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    os.unlink(f.name)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if regs is None:
        raise RuntimeError(f"ptxas gave no register count:\n{text[-2000:]}")
    return int(regs.group(1)), int(spill.group(1)) if spill else 0, int(spill.group(2)) if spill else 0


def divisibility_attrs(kernel, signature: dict) -> dict:
    """What a real launch tells the compiler: torch's tensors are 16-byte aligned and the strides
    at the real head shapes are multiples of 16, so Triton specialises those arguments as
    divisible by 16, which lets it vectorise the state loads. Without it the offline build picks
    other layouts and registers (the Mamba-2 decode: 240 registers offline, 96 on the H200)."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
            if signature.get(name, "constexpr") != "constexpr"
            and (signature[name].startswith("*") or name.startswith("stride"))}


def signature(kernel, pointers: dict, constexprs: dict) -> dict:
    """Argument types of one variant; a constexpr left out of `constexprs` takes its default
    (added to `constexprs`), as a launch that does not pass it would."""
    for p in kernel.params:
        if p.is_constexpr and p.has_default and p.name not in constexprs:
            constexprs[p.name] = p.default
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        elif name.startswith(("scale", "softplus")):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def gdn_pointers(**types) -> dict:
    """Pointer types of the GDN kernels' arguments (activations and raw rings bf16, state and the
    fp32 rings fp32, indices int32); `types` overrides some, e.g. `ring_rawk="*fp32"` where a
    replay form reads the fp32 `k` ring through that argument."""
    act = {n: "*bf16" for n in ("q", "k", "v", "a", "b", "o", "ring_d", "ring_rawv", "ring_rawk", "ring_fk")}
    f32 = {n: "*fp32" for n in ("A_log", "dt_bias", "state", "dst", "ring_k", "ring_g", "ring_beta", "scratch")}
    i32 = {n: "*i32" for n in ("slot_idx", "row_wp", "row_flush", "origin", "wpos", "dst_idx", "row_nfold",
                               "row_origin", "snap_at", "snap_slot", "num_accepted", "tickets")}
    return {**act, **f32, **i32, **types}


def gdn_rows(H=16, HV=32, K=128, V=128, L=16, T=4):
    from replayssm_kernels.configs import GDN_UNROLL_SWEEP, gdn_replay_unroll
    from replayssm_kernels.gdn import decode, fold, verify, verify_loop, verify_mm

    ptrs = gdn_pointers()
    head = dict(H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), RL=L, RLB=triton.next_power_of_2(L))
    rows = []
    for split, bv, warps, fcols, dot in ((0, 32, 1, 32, 0), (0, 32, 1, 8, 0), (0, 32, 1, 4, 0), (1, 32, 1, 8, 0),
                                         (1, 32, 2, 8, 0), (1, 64, 4, 8, 0), (1, 64, 2, 8, 1)):
        phases = (0,) if not split else (2, 1)
        for phase in phases:
            c = dict(head, BV=32 if phase == 2 else bv, BVF=fcols, USE_DOT=bool(dot), EVICT=True, PHASE=phase,
                     UNROLL=gdn_replay_unroll())
            w = 1 if phase != 1 else warps
            name = f"decode {'fused' if phase == 0 else ('flush' if phase == 2 else 'non-flush')} " \
                   f"bv{c['BV']} w{w} flushcols{fcols}{' dot' if dot else ''}"
            rows.append((name, *ptxas_report(decode._gdn_decode_kernel,
                                             signature(decode._gdn_decode_kernel, ptrs, c), c, w)))
    for bv, warps, prod in ((32, 1, 0), (32, 2, 0), (32, 4, 0), (32, 1, 1), (32, 2, 1), (32, 4, 1), (32, 4, 2),
                            (64, 4, 2)):
        c = dict(head, BV=bv, BT=triton.next_power_of_2(T))
        kern = verify._gdn_verify_kernel if prod < 2 else verify_mm._gdn_verify_mm_kernel
        if prod < 2:
            c["USE_DOT"] = bool(prod)
        else:
            c["RLB"] = max(c["RLB"], 16)
        name = f"verify bv{bv} w{warps} {('reductions', 'tf32x3 products', 'matrix form')[prod]}"
        rows.append((name, *ptxas_report(kern, signature(kern, ptrs, c), c, warps, num_stages=2)))
    from replayssm_kernels.gdn import verify_split

    for t_win, rows_mode, what in ((T, False, "verify"), (1, True, "decode plan 3 (non-flush + flush rows)")):
        bt = triton.next_power_of_2(t_win)
        ns = verify_split.scratch_floats(bt, head["RLB"])
        c = dict(H=H, HV=HV, K=K, BK=head["BK"], BT=bt, RL=L, RLB=head["RLB"], NS=ns, ROWS=rows_mode)
        kern = verify_split._gdn_verify_prep_kernel
        rows.append((f"{what}: two-launch prep w4", *ptxas_report(kern, signature(kern, ptrs, c), c, 4, 2)))
        # (BV, K chunk, ring history value-row major): configs.gdn_state_kc / gdn_history_rt
        for bv, kc, rt in ((8, 0, 0), (16, 0, 0), (32, 0, 0), (16, 32, 0), (16, 0, 1), (16, 32, 1), (8, 32, 1)):
            c = dict(H=H, HV=HV, K=K, V=V, BK=head["BK"], BV=bv, BT=bt, RL=L, RLB=head["RLB"], NS=ns, EVICT=True,
                     ROWS=rows_mode, FLUSH=rows_mode, KC=kc, RT=bool(rt))
            kern = verify_split._gdn_verify_state_kernel
            rows.append((f"{what}: two-launch state bv{bv} w1 kc{kc}{' history-rt' if rt else ''}",
                         *ptxas_report(kern, signature(kern, ptrs, c), c, 1, 2)))
    # Decode plan 4: plan 3's state launch that makes its own ring products (no prep launch).
    c = dict(H=H, HV=HV, K=K, V=V, BK=head["BK"], BV=16, BT=1, RL=L, RLB=head["RLB"],
             NS=verify_split.scratch_floats(1, head["RLB"]), EVICT=True, ROWS=True, FLUSH=True, KC=0, RT=True,
             INLINE=True)
    kern = verify_split._gdn_verify_state_kernel
    rows.append(("decode plan 4 (state launch with its own ring products) bv16 w1 history-rt",
                 *ptxas_report(kern, signature(kern, {**ptrs, "ring_kn": "*fp32", "ring_kraw": "*bf16"}, c), c, 1, 2)))
    # Decode plan 5: one program per row and value head (gdn/verify_loop.py), 2 stages as benchmarked.
    c = dict(H=H, HV=HV, K=K, V=V, BK=head["BK"], BV=16, BVF=8, RL=L, RLB=head["RLB"], EVICT=True,
             UNROLL=gdn_replay_unroll(), RT=True, ORDER=True, NSTG=2)
    kern = verify_loop._gdn_decode_loop_kernel
    for vs, vsf in ((1, 0), (2, 0), (1, 8)):
        cv = {**c, "VS": vs, "VSF0": vsf}
        rows.append(("decode plan 5 (one program per row and value head) bv16 w1 history-rt"
                     + (f", {vs} programs per row and value head" if vs > 1 else "")
                     + (f", {vsf} per flush row and value head" if vsf else ""),
                     *ptxas_report(kern, signature(kern, {**ptrs, "ring_kn": "*fp32", "ring_kraw": "*bf16",
                                                          "row_order": "*i32"}, cv), cv, 1, 2)))
    for bvf in (32, 8):
        for unroll in (gdn_replay_unroll(), *GDN_UNROLL_SWEEP):
            c = dict(H=H, HV=HV, K=K, V=V, BK=head["BK"], BV=32, BVF=bvf, RL=L, HAS_DST=False, HAS_SNAP=True,
                     UNROLL=unroll)
            rows.append((f"fold bv32 w1 cols{bvf} unroll {unroll}",
                         *ptxas_report(fold._gdn_fold_kernel, signature(fold._gdn_fold_kernel, ptrs, c), c, 1)))
    # The tree form (gdn/common.py): keys from the fp32 `k` ring.
    ptrs_tree = gdn_pointers(ring_rawk="*fp32")
    for bvf in (32, 16, 8):
        c = dict(H=H, HV=HV, K=K, V=V, BK=head["BK"], BV=32, BVF=bvf, RL=L, HAS_DST=False, HAS_SNAP=True,
                 UNROLL=gdn_replay_unroll(), TREE=True)
        rows.append((f"fold tree bv32 w1 cols{bvf}",
                     *ptxas_report(fold._gdn_fold_kernel, signature(fold._gdn_fold_kernel, ptrs_tree, c), c, 1)))
        c = dict(head, BV=32, BVF=bvf, USE_DOT=False, EVICT=True, PHASE=2, UNROLL=gdn_replay_unroll(), TREE=True)
        rows.append((f"decode flush tree bv32 w1 flushcols{bvf}", *ptxas_report(
            decode._gdn_decode_kernel, signature(decode._gdn_decode_kernel, ptrs, c), c, 1)))
    return rows


def asm_operand_layouts(ttgir: str) -> list[tuple[str, str]]:
    """(shape, layout) of the operand of every inline-asm op in a TTGIR module, its layout alias
    resolved (`#blocked3` -> `#ttg.blocked<{...}>`)."""
    aliases = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, flags=re.M))
    ops = re.findall(r"tt\.elementwise_inline_asm .*? : tensor<([0-9x]+)xf32, (#\w+)> ->", ttgir)
    return [(shape, aliases.get(alias, alias)) for shape, alias in ops]


def shuffle_form_rows(H=16, HV=32, K=128, V=128, L=16, T=4):
    """The kernels that replay in the shuffle form (`gdn_k_tree` = 2, gdn/lanes.py): the fold, the
    decode plan-3 state launch (flush rows) and the flush launch of plans 0-2. Per variant: name,
    registers, spill bytes, `shfl.sync` count in the PTX, and the inline-asm operand layouts."""
    from replayssm_kernels.configs import gdn_replay_unroll
    from replayssm_kernels.gdn import decode, fold, verify_split

    ptrs = gdn_pointers(ring_fk="*fp32")  # the plan-3 state launch's flush rows read the fp32 `k` ring
    ptrs_fold = gdn_pointers(ring_rawk="*fp32")  # the replay's keys come from the fp32 `k` ring
    BK, RLB = triton.next_power_of_2(K), triton.next_power_of_2(L)
    variants = []
    for bvf in (8, 4, 16):
        c = dict(H=H, HV=HV, K=K, V=V, BK=BK, BV=32, BVF=bvf, RL=L, HAS_DST=False, HAS_SNAP=True,
                 UNROLL=gdn_replay_unroll(), TREE=2)
        variants.append((f"fold shuffle cols{bvf}", fold._gdn_fold_kernel, ptrs_fold, c, 1, 3))
    ns = verify_split.scratch_floats(1, RLB)
    c = dict(H=H, HV=HV, K=K, V=V, BK=BK, BV=16, BT=1, RL=L, RLB=RLB, NS=ns, EVICT=True, ROWS=True, FLUSH=True,
             BVF=8, UNROLL=gdn_replay_unroll(), TREE=2)
    variants.append(("decode plan 3 state launch shuffle bv16 flushcols8", verify_split._gdn_verify_state_kernel,
                     ptrs, c, 1, 2))
    c = dict(H=H, HV=HV, K=K, V=V, BK=BK, BV=32, BVF=8, RL=L, RLB=RLB, USE_DOT=False, EVICT=True, PHASE=2,
             UNROLL=gdn_replay_unroll(), TREE=2)
    variants.append(("decode flush launch shuffle bv32 flushcols8", decode._gdn_decode_kernel, ptrs, c, 1, 3))
    rows = []
    for name, kern, p, c, warps, stages in variants:
        compiled = compile_variant(kern, signature(kern, p, c), c, warps, stages)
        regs, st, ld = ptxas_report(kern, None, c, warps, stages, compiled=compiled)
        rows.append(dict(name=name, regs=regs, spill_stores=st, spill_loads=ld,
                         shfl=len(re.findall(r"\bshfl\.sync", compiled.asm["ptx"])),
                         asm_operands=asm_operand_layouts(compiled.asm["ttgir"])))
    return rows


NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")


def _sass(cubin: bytes) -> tuple[list[str], dict[str, int]]:
    """A cubin's SASS instructions in order, and its branch labels (label -> index of the
    instruction after it)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    sass = subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    labels, ins = {}, []
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1))
    return ins, labels


def _opcodes(ins: list[str]) -> dict[str, int]:
    """Counts per opcode (predicate and modifiers dropped: `@P0 FADD.FTZ` -> FADD)."""
    ops: dict[str, int] = {}
    for op in ins:
        name = re.sub(r"^@!?U?P\w+\s+", "", op).split()[0].split(".")[0]
        ops[name] = ops.get(name, 0) + 1
    return ops


def sass_loops(cubin: bytes) -> list[tuple[int, dict]]:
    """(instructions, opcode counts) of each loop body (label .. backward branch) in a cubin's SASS."""
    ins, labels = _sass(cubin)
    loops = []
    for i, text in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)
        if m and labels.get(m.group(1), len(ins)) <= i:
            body = ins[labels[m.group(1)]:i + 1]
            loops.append((len(body), _opcodes(body)))
    return loops


def replay_loop_rows(H=16, HV=32, K=128, V=128, L=16):
    """The commit fold's replay loop (one ring entry, one 8-column sub-tile) per form of the exact
    replay (`configs.gdn_k_tree`: plain, tree, shuffle): SASS instructions per loop body and the
    opcodes that matter for it (sm_90)."""
    from replayssm_kernels.gdn import fold

    rows = []
    for form, what in ((0, "plain"), (1, "tree"), (2, "shuffle")):
        ptrs = gdn_pointers(ring_rawk="*fp32" if form else "*bf16")
        c = dict(H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=32, BVF=8, RL=L, HAS_DST=False,
                 HAS_SNAP=False, FROM_CURSORS=False, UNROLL=1, TREE=form)
        kern = fold._gdn_fold_kernel
        compiled = compile_variant(kern, signature(kern, ptrs, c), c, 1)
        n, ops = sass_loops(compiled.asm["cubin"])[0]
        rows.append((what, n, ops))
    return rows


def sass_ops(cubin: bytes) -> tuple[int, dict]:
    """(instructions, opcode counts) of a whole cubin's SASS."""
    ins, _ = _sass(cubin)
    return len(ins), _opcodes(ins)


# (label, BV, warps, KC, history read value-row major, tensor-core products): the verify's state
# launch plans the --state-launch table compares (T = 4, no flush rows).
STATE_LAUNCH_PLANS = (
    ("default: warp reductions, K chunks of 32", 16, 1, 32, False, False),
    ("warp reductions, K chunks of 32, history value-row major", 16, 1, 32, True, False),
    ("tensor cores (gdn_state_dot)", 16, 1, 0, False, True),
    ("tensor cores, 32 rows, 2 warps", 32, 2, 0, False, True),
    ("tensor cores, 64 rows, 4 warps", 64, 4, 0, False, True),
    ("tensor cores, 128 rows, 4 warps", 128, 4, 0, False, True),
)


# (label, BV, warps, stages, fused[, VS]): the verify's state launch as one program per row and value
# head walking its value rows (verify plan products 5, `gdn/verify_loop.py`), and with the prep's
# products made in it (products 6: the whole verify in one launch; the GPU's tree-form rings); VS
# programs per row and value head where given (the loop split, `configs.gdn_verify_loop_split`).
STATE_LOOP_PLANS = (
    ("tensor cores, one program per row and value head, 16-row tiles, 2 stages", 16, 1, 2, False),
    ("tensor cores, one program per row and value head, 16-row tiles, 3 stages", 16, 1, 3, False),
    ("tensor cores, one program per row and value head, 32-row tiles, 2 warps, 2 stages", 32, 2, 2, False),
    ("tensor cores, one program per row and value head, no prep launch, 16-row tiles, 2 stages", 16, 1, 2, True),
    ("tensor cores, one program per row and value head, no prep launch, 32-row tiles, 2 warps, 2 stages", 32, 2, 2,
     True),
    ("tensor cores, no prep launch, 16-row tiles, 1 stage, 8 programs per row and value head (one tile each)", 16,
     1, 1, True, 8),
    ("tensor cores, no prep launch, 16-row tiles, 2 stages, 2 programs per row and value head", 16, 1, 2, True, 2),
)


def _loop_body(ins: list[str], labels: dict[str, int]) -> int:
    """Instructions of the longest loop in a SASS listing (a branch back to an earlier label),
    branch included; 0 if there is none."""
    longest = 0
    for i, op in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", op)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            longest = max(longest, i + 1 - labels[m.group(1)])
    return longest


def state_launch_rows(H=16, HV=32, K=128, V=128, L=16, T=4):
    """The GDN verify's state launch per plan of STATE_LAUNCH_PLANS and STATE_LOOP_PLANS: SASS
    instructions (each warp of a program runs them all; a looping program runs its loop body once
    per tile), warp instructions issued per 16 value rows (the loop body's, for a looping
    program: its prologue runs once per row and value head), shuffles, MMA instructions,
    asynchronous copies (software-pipelined tile loads), registers, shared memory."""
    from replayssm_kernels.gdn import verify_loop, verify_split

    ptrs = gdn_pointers()
    BT, RLB = triton.next_power_of_2(T), max(triton.next_power_of_2(L), 16)
    common = dict(H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BT=BT, RL=L, RLB=RLB,
                  NS=verify_split.scratch_floats(BT, RLB), EVICT=True, NP=max(16, 2 * BT))
    plans = [(what, verify_split._gdn_verify_state_kernel, bv, warps, 2,
              dict(common, BV=bv, ROWS=False, FLUSH=False, KC=kc, RT=rt, DOT=dot))
             for what, bv, warps, kc, rt, dot in STATE_LAUNCH_PLANS]
    plans += [(what, verify_loop._gdn_verify_fused_kernel if fused else verify_loop._gdn_verify_state_loop_kernel,
               bv, warps, stages,
               {**{n: x for n, x in common.items() if not (fused and n == "NS")}, "BV": bv, "RT": False,
                "NSTG": stages, **({"TREE": 2, "RAW_K": False} if fused else {}), **({"VS": vs[0]} if vs else {})})
              for what, bv, warps, stages, fused, *vs in STATE_LOOP_PLANS]
    rows = []
    for what, kern, bv, warps, stages, c in plans:
        compiled = compile_variant(kern, signature(kern, ptrs, c), c, warps, stages)
        regs, st, ld = ptxas_report(kern, None, c, warps, stages, compiled=compiled)
        ins, labels = _sass(compiled.asm["cubin"])
        ops = _opcodes(ins)
        # Instructions per tile: a per-tile program's all; a looping program's loop body; with a loop
        # split, its whole program over the tiles of its share.
        vs = c.get("VS", 1)
        if "NSTG" not in c:
            per_tile = len(ins)
        elif vs > 1:
            per_tile = len(ins) / triton.cdiv(triton.cdiv(V, bv), vs)
        else:
            per_tile = _loop_body(ins, labels)
        rows.append(dict(plan=what, block_v=bv, warps=warps, sass=len(ins),
                         sass_per_16_rows=round(per_tile * warps * 16 / bv), shfl=ops.get("SHFL", 0),
                         mma=ops.get("HMMA", 0) + ops.get("HGMMA", 0), async_copies=ops.get("LDGSTS", 0),
                         regs=regs, smem=compiled.metadata.shared, spills=st + ld))
    return rows


def pdl_rows(H=16, HV=32, K=128, V=128, L=16, T=4):
    """The GDN two-launch pair (gdn/verify_split.py): the verify at T (plan 32x1x2x4; the default
    verify plans are one launch since session 30) and the decode's plan 3 at T = 1 (default tiles),
    built with and without PDL (configs.gdn_pdl): per kernel, its `griddepcontrol` instructions in the PTX, and for the state launch the checkpoint
    tile's loads (the `evict_first` ones) before and after its `griddepcontrol.wait`: the launch
    overlaps the prep launch only with what it loads before the wait."""
    from replayssm_kernels.configs import gdn_decode_config, gdn_history_rt, gdn_state_dot, gdn_state_kc
    from replayssm_kernels.gdn import verify_split

    ptrs = gdn_pointers()
    BK = triton.next_power_of_2(K)
    rows = []
    for what, t_win, decode in (("verify", T, False), ("decode plan 3", 1, True)):
        bt = triton.next_power_of_2(t_win)
        dot = not decode and gdn_state_dot(False)
        rlb = max(triton.next_power_of_2(L), 16) if dot else triton.next_power_of_2(L)
        ns = verify_split.scratch_floats(bt, rlb)
        if decode:
            cfg = gdn_decode_config(K, V)
            bv, warps, stages = cfg.block_v, cfg.num_warps, cfg.num_stages
        else:
            bv, warps, stages = 32, 1, 2  # the two-launch verify plan (32x1x2x4): PDL pairs its launches
        for pdl in (False, True):
            c = dict(H=H, HV=HV, K=K, BK=BK, BT=bt, RL=L, RLB=rlb, NS=ns, ROWS=decode, PDL=pdl)
            kern = verify_split._gdn_verify_prep_kernel
            ptx = compile_variant(kern, signature(kern, ptrs, c), c, 4, 2).asm["ptx"]
            rows.append(dict(kernel=f"{what}: prep", pdl=pdl,
                             launch_dependents=ptx.count("griddepcontrol.launch_dependents"),
                             wait=ptx.count("griddepcontrol.wait"), tile_loads_before=None, tile_loads_after=None))
            c = dict(H=H, HV=HV, K=K, V=V, BK=BK, BV=bv, BT=bt, RL=L, RLB=rlb, NS=ns, EVICT=True, ROWS=decode,
                     FLUSH=decode, KC=0 if dot else gdn_state_kc(K, decode=decode), RT=gdn_history_rt(decode),
                     DOT=dot, NP=max(16, 2 * bt), PDL=pdl)
            kern = verify_split._gdn_verify_state_kernel
            ptx = compile_variant(kern, signature(kern, ptrs, c), c, warps, stages).asm["ptx"]
            cut = ptx.find("griddepcontrol.wait")
            before = ptx[:cut] if cut >= 0 else ptx
            after = ptx[cut:] if cut >= 0 else ""
            rows.append(dict(kernel=f"{what}: state", pdl=pdl,
                             launch_dependents=ptx.count("griddepcontrol.launch_dependents"),
                             wait=ptx.count("griddepcontrol.wait"),
                             tile_loads_before=before.count("L2::evict_first"),
                             tile_loads_after=after.count("L2::evict_first")))
    return rows


def decode_plan5_rows(H=16, HV=32, K=128, V=128, L=16, caps=(0, 96, 80), dot=False, plan=None):
    """GDN decode plan 5 as served on split checkpoints (configs.gdn_decode_config at 256 rows, bf16
    activations: outputs from the checkpoint's `hi` plane; the replay form in effect, and its rings),
    with and without its flush capacity, at each register cap of `caps` (configs.gdn_decode_maxnreg;
    0 = none): registers, spills, shared memory and the one-warp programs an SM holds by registers.
    `dot`: the plan with its tensor-core products (its sixth number 1; the served form since session
    53), else with the warp reductions (the served form before). `plan`: a `gdn_decode` plan key
    (`5x16x1x1x8x1x1x1x8x13x96`) instead of the served one."""
    from replayssm_kernels import configs
    from replayssm_kernels.configs import check_exact_replay_warps, gdn_decode_config, gdn_k_tree
    from replayssm_kernels.gdn import verify_loop
    from replayssm_kernels.gdn.decode import plan5_constexprs

    if plan is None:
        cfg = replace(gdn_decode_config(K, V, rows=256, split_ckpt=True), use_dot=dot)
    else:
        nums = configs.parse_plan("gdn_decode", plan)
        if nums is None or nums[0] != 5:
            raise SystemExit(f"--plans: {plan!r} is not a decode plan 5 key (5xBVxWxSxFxDxE[xLS[xFS[xCAP[xMAXNREG]]]])")
        with configs.override("gdn_decode", nums):
            cfg = gdn_decode_config(K, V, rows=256, split_ckpt=True)
    kern = verify_loop._gdn_decode_loop_kernel
    tree = gdn_k_tree(K)  # the replay form in effect; the tree and shuffle forms read the fp32 `k` ring
    try:
        check_exact_replay_warps(cfg.num_warps, tree, "decode plan 5")  # as the launch: refused there, not screened
    except ValueError as e:
        raise SystemExit(f"--plans: {cfg.key()}: {e}") from None
    ptrs = {**gdn_pointers(), "ring_fk": "*fp32" if tree else "*bf16", "ring_kn": "*fp32", "ring_kraw": "*bf16",
            "row_order": "*i32", "flush_index": "*i32"}
    base = replace(cfg, maxnreg=0)  # the plan's own cap (its eleventh number) is one of `caps`' rows
    rows = []
    for fcap in (bool(cfg.flush_cap), False) if cfg.flush_cap else (False,):
        cv = plan5_constexprs(cfg, H, HV, K, V, L, tree=tree, split=True, half=True, ordered=True,
                              raw_k=not tree, capped=fcap)
        sig = signature(kern, ptrs, cv)
        for cap in caps:
            comp = compile_variant(kern, sig, cv, cfg.num_warps, cfg.launch_stages, maxnreg=cap)  # as the launch
            regs, st, ld = ptxas_report(kern, sig, cv, cfg.num_warps, compiled=comp)
            rows.append({"plan": base.key() if fcap else replace(base, flush_cap=0).key() + " (no capacity)",
                         "maxnreg": cap, "regs": regs, "spill_stores": st, "spill_loads": ld,
                         "smem": comp.metadata.shared,
                         "programs_by_regs": min(32, 65536 // (regs * 32 * cfg.num_warps))})
    return rows


def mamba2_rows(NH=128, P=64, G=8, N=128, L=16, T=4):
    """The Mamba-2 decode kernel: the default one-launch tile, the split plans' launches
    (`configs.mamba2_decode_plan`; the plans of `configs.MAMBA2_DECODE_SWEEP`) and the chunked tiles
    (`configs.MAMBA2_TILE_SWEEP`); the verify kernel with the default and the chunked tiles."""
    from replayssm_kernels.configs import (
        MAMBA2_DECODE_SWEEP,
        MAMBA2_TILE_SWEEP,
        MAMBA2_UNROLL_SWEEP,
        mamba2_replay_unroll,
    )
    from replayssm_kernels.mamba2 import common, decode, verify

    act = {n: "*bf16" for n in ("x", "dt", "Bm", "C", "z", "o", "ring_x", "ring_B", "ring_dt")}
    f32 = {n: "*fp32" for n in ("A", "D", "dt_bias", "state", "ring_bc")}
    i32 = {n: "*i32" for n in ("slot_idx", "row_wp", "row_flush", "origin", "wpos")}
    ptrs = {**act, **f32, **i32}
    head = dict(NH=NH, P=P, G=G, N=N, RL=L, RLB=triton.next_power_of_2(L), HAS_Z=True)
    kern = decode._mamba2_decode_kernel
    rows = []
    default = common.tile_config("decode", P, N)
    plans = [("one launch", 0, default)]
    for _split, bm, warps, stages in MAMBA2_DECODE_SWEEP:
        plans.append((f"split flush bm{bm} w{warps}", 1, common.make_tile(bm, bm, warps, stages, P, N)))
    plans.append(("split non-flush", 2, default))
    chunked = [common.chunked_tile(bm, nc, default.BMF, w, default.num_stages, P, N) for bm, nc, w in MAMBA2_TILE_SWEEP]
    plans += [("chunked", 0, t) for t in chunked]
    plans = [(w, m, t, mamba2_replay_unroll(), False) for w, m, t in plans]
    plans += [(f"one launch, replay unroll {u}", 0, default, u, False) for u in MAMBA2_UNROLL_SWEEP]
    plans += [("ring B . C launched apart", 0, default, mamba2_replay_unroll(), True)]
    plans += [("ring B . C launched apart", 0, t, mamba2_replay_unroll(), True) for t in chunked if t.num_warps == 2]
    for what, mode, t, unroll, ring_bc in plans:
        c = dict(head, UNROLL=unroll, BM=t.BM, BMF=t.BMF, BN=t.BN, MODE=mode, NC=t.NC, RING_BC=ring_bc)
        rows.append((f"decode {what} (BM {t.BM} x {t.NC}, BMF {t.BMF}, w{t.num_warps})",
                     *ptxas_report(kern, signature(kern, ptrs, c), c, t.num_warps, t.num_stages)))
    kern = decode._mamba2_ring_bc_kernel
    c = dict(G=G, N=N, BN=triton.next_power_of_2(N), RL=L, RLB=triton.next_power_of_2(L))
    rows.append(("decode ring B . C launch (one program per row and group, w4)",
                 *ptxas_report(kern, signature(kern, {"C": "*bf16", "ring_B": "*bf16", "ring_bc": "*fp32", **i32}, c),
                               c, 4)))
    kern = verify._mamba2_verify_kernel
    vdef = common.tile_config("verify", P, N)
    for t in [vdef] + [common.chunked_tile(bm, nc, vdef.BMF, w, vdef.num_stages, P, N) for bm, nc, w in MAMBA2_TILE_SWEEP]:
        c = dict(head, BM=t.BM, BN=t.BN, BT=triton.next_power_of_2(T), NC=t.NC)
        rows.append((f"verify T={T} (BM {t.BM} x {t.NC}, w{t.num_warps})",
                     *ptxas_report(kern, signature(kern, ptrs, c), c, t.num_warps, t.num_stages)))
    return rows


def main(argv=None):
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shuffle-form", action="store_true",
                    help="only the shuffle-form kernels (gdn_k_tree = 2), one JSON line each, with their "
                         "shfl count and inline-asm operand layouts")
    ap.add_argument("--replay-loop", action="store_true",
                    help="only the GDN fold's replay loop body (SASS) per form of the exact replay")
    ap.add_argument("--state-launch", action="store_true",
                    help="only the GDN verify's state launch per plan (SASS per program and per 16 value rows)")
    ap.add_argument("--decode-plan5", action="store_true",
                    help="only GDN decode plan 5 as served on split checkpoints (its warp-reduction form unless "
                         "--dot), per register cap")
    ap.add_argument("--caps", default="0,96,80",
                    help="with --decode-plan5: register caps to build (configs.gdn_decode_maxnreg; 0 = none)")
    ap.add_argument("--dot", action="store_true",
                    help="with --decode-plan5: the plan's tensor-core products (its sixth number 1, the served "
                         "form since session 53); without it the warp reductions")
    ap.add_argument("--plans", default="",
                    help="with --decode-plan5: comma-separated gdn_decode plan keys to build instead of the served "
                         "plan (each key's sixth number is its tensor-core form)")
    ap.add_argument("--pdl", action="store_true",
                    help="only the GDN prep/state pair with and without programmatic dependent launch")
    args = ap.parse_args(argv)
    if args.plans and args.dot:
        ap.error("--dot with --plans: each plan key's sixth number sets its tensor-core form; drop --dot")
    if args.decode_plan5:
        print(f"| GDN decode plan 5, split checkpoints (sm_90, triton {triton.__version__}) | maxnreg | registers | "
              "spill stores (B) | spill loads (B) | shared memory (B) | one-warp programs an SM by registers |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        caps = tuple(int(x) for x in args.caps.split(","))
        rows = (r for plan in (args.plans.split(",") if args.plans else [None])
                for r in decode_plan5_rows(caps=caps, dot=args.dot, plan=plan))
        for r in rows:
            print(f"| {r['plan']} | {r['maxnreg']} | {r['regs']} | {r['spill_stores']} | {r['spill_loads']} | "
                  f"{r['smem']} | {r['programs_by_regs']} |", flush=True)
        return
    if args.pdl:
        print(f"| GDN prep/state pair (sm_90, triton {triton.__version__}) | PDL | launch_dependents | wait | "
              "checkpoint loads before the wait | after |")
        print("|---|---|---:|---:|---:|---:|")
        for r in pdl_rows():
            print(f"| {r['kernel']} | {int(r['pdl'])} | {r['launch_dependents']} | {r['wait']} | "
                  f"{'' if r['tile_loads_before'] is None else r['tile_loads_before']} | "
                  f"{'' if r['tile_loads_after'] is None else r['tile_loads_after']} |", flush=True)
        return
    if args.state_launch:
        print(f"| GDN verify state launch, T=4 (sm_90, triton {triton.__version__}) | rows x warps | SASS "
              "instructions | warp instructions per 16 value rows | SHFL | MMA | async copies | registers | "
              "shared memory (B) | spills (B) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in state_launch_rows():
            print(f"| {r['plan']} | {r['block_v']} x {r['warps']} | {r['sass']} | {r['sass_per_16_rows']} | "
                  f"{r['shfl']} | {r['mma']} | {r['async_copies']} | {r['regs']} | {r['smem']} | {r['spills']} |",
                  flush=True)
        return
    if args.replay_loop:
        keys = ("SHFL", "SEL", "FADD", "FMUL", "FFMA", "MUFU", "LDG", "LDS", "STS", "BAR")
        print(f"| GDN fold replay loop, one entry x 8 columns (sm_90, triton {triton.__version__}) | SASS "
              "instructions | " + " | ".join(keys) + " |")
        print("|---|---:|" + "---:|" * len(keys))
        for what, n, ops in replay_loop_rows():
            print(f"| {what} | {n} | " + " | ".join(str(ops.get(k, 0)) for k in keys) + " |", flush=True)
        return
    if args.shuffle_form:
        for row in shuffle_form_rows():
            print(json.dumps(row), flush=True)
        return
    print(f"| kernel (GDN, H=16, HV=32, K=V=128, L=16, T=4; sm_90, triton {triton.__version__}) "
          "| registers | spill stores (B) | spill loads (B) |")
    print("|---|---:|---:|---:|")
    for name, regs, st, ld in gdn_rows():
        print(f"| {name} | {regs} | {st} | {ld} |", flush=True)
    for P in (64, 80):
        print(f"\n| kernel (Mamba-2, NH=128, P={P}, G=8, N=128, L=16; sm_90, triton {triton.__version__}) "
              "| registers | spill stores (B) | spill loads (B) |")
        print("|---|---:|---:|---:|")
        for name, regs, st, ld in mamba2_rows(P=P):
            print(f"| {name} | {regs} | {st} | {ld} |", flush=True)


if __name__ == "__main__":
    main()
