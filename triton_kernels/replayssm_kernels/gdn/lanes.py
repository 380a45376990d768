"""Sums across a warp's 32 lanes for the shuffle form of the GDN exact replay (`gdn_k_tree` = 2).

SGLang's recurrent kernel adds each state column's K products in a fixed order on the H200: every
lane g (of 32) chains its 4 consecutive keys, then a butterfly pairs lanes g ^ 16, g ^ 8, g ^ 4,
g ^ 2, g ^ 1 (gdn/common.py). Triton lowers that butterfly column by column, 5 shuffles and 5
adds per column, so a replay of 8 columns spends 40 shuffles per ring entry (of 272 instructions
in the sm_90 build of the fold's loop, `scripts/kernel_regs.py --replay-loop`).

`lane_allsum` gives every lane the same sums for N columns at once with 2N - 1 + 5 - log2(N)
shuffles (17 for N = 8): a reduce-scatter over the first log2(N) lane distances (the lane with
the distance's bit set keeps the upper half of its columns and receives the partner's partials
for them), the plain butterfly over the distances left, then each column's sum read from a lane
that holds it (N independent indexed shuffles). Every partial sum it forms is one the butterfly
forms, `own + partner` with the same two operands (IEEE addition commutes), so the bits are the
butterfly's.

It needs each lane of the warp to hold the N columns' partials of lane index g = its lane id
(`[N, 32]` with axis 1 on the lanes, one warp): `tests/test_gdn_lanes.py` checks that layout in
the offline sm_90 build of the kernels and runs the PTX below on a 32-lane model. Under the
interpreter (no PTX) the same pairings are written as tensor sums.
"""

from __future__ import annotations

import itertools

import triton
import triton.language as tl

from ..configs import interpreted

_INTERPRET = tl.constexpr(interpreted())
LANES = 32
_WIDTHS = (1, 2, 4, 8, 16, 32)


def allsum_ptx(n: int) -> str:
    """Inline PTX: operands `$n .. $2n-1` are a lane's n partials, `$0 .. $n-1` receive the n
    sums over the warp (the butterfly's bits, the same in every lane)."""
    if n not in _WIDTHS:
        raise ValueError(f"lane_allsum takes 1, 2, 4, 8, 16 or 32 columns, not {n}")
    names = (f"f{i}" for i in itertools.count())
    regs: list[str] = []
    preds: dict[int, str] = {}
    body = ["mov.u32 lane, %laneid;"]

    def reg() -> str:
        regs.append(next(names))
        return regs[-1]

    def upper(d: int) -> str:
        """Predicate: this lane's bit `d` is set (it owns the upper half at distance d)."""
        if d not in preds:
            preds[d] = f"p{d}"
            body.extend([f"and.b32 bit, lane, {d};", f"setp.ne.u32 {preds[d]}, bit, 0;"])
        return preds[d]

    cur = [f"${n + i}" for i in range(n)]
    d = LANES // 2
    scattered = []
    while len(cur) > 1:  # reduce-scatter
        p, h = upper(d), len(cur) // 2
        nxt = []
        for i in range(h):
            snd, keep, rcv, out = reg(), reg(), reg(), reg()
            body += [f"selp.b32 {snd}, {cur[i]}, {cur[h + i]}, {p};",
                     f"selp.b32 {keep}, {cur[h + i]}, {cur[i]}, {p};",
                     f"shfl.sync.bfly.b32 {rcv}, {snd}, {d}, 0x1f, 0xffffffff;",
                     f"add.rn.f32 {out}, {keep}, {rcv};"]
            nxt.append(out)
        cur, scattered, d = nxt, scattered + [d], d // 2
    while d >= 1:  # butterfly on the one column left
        rcv, out = reg(), reg()
        body += [f"shfl.sync.bfly.b32 {rcv}, {cur[0]}, {d}, 0x1f, 0xffffffff;",
                 f"add.rn.f32 {out}, {cur[0]}, {rcv};"]
        cur, d = [out], d // 2
    if scattered:  # all-gather: position P's sum sits in the lanes whose top bits spell P
        shift = LANES.bit_length() - 1 - len(scattered)
        outs = []
        for pos in range(n):
            outs.append(reg())
            body.append(f"shfl.sync.idx.b32 {outs[-1]}, {cur[0]}, {pos << shift}, 0x1f, 0xffffffff;")
        cur = outs
    body += [f"mov.b32 ${i}, {c};" for i, c in enumerate(cur)]
    decl = [".reg .u32 lane, bit;", f".reg .b32 {', '.join(regs)};"] if regs else [".reg .u32 lane, bit;"]
    if preds:
        decl.append(f".reg .pred {', '.join(preds.values())};")
    return "{\n" + "\n".join(decl + body) + "\n}"


def allsum_constraints(n: int) -> str:
    return ",".join(["=r"] * n + ["r"] * n)


def shuffles(n: int) -> int:
    """Shuffles per call of `lane_allsum` over n columns (5 per column in the butterfly)."""
    log_n = n.bit_length() - 1
    return (n - 1) + (5 - log_n) + (n if n > 1 else 0)


_ASM1, _CON1 = tl.constexpr(allsum_ptx(1)), tl.constexpr(allsum_constraints(1))
_ASM2, _CON2 = tl.constexpr(allsum_ptx(2)), tl.constexpr(allsum_constraints(2))
_ASM4, _CON4 = tl.constexpr(allsum_ptx(4)), tl.constexpr(allsum_constraints(4))
_ASM8, _CON8 = tl.constexpr(allsum_ptx(8)), tl.constexpr(allsum_constraints(8))
_ASM16, _CON16 = tl.constexpr(allsum_ptx(16)), tl.constexpr(allsum_constraints(16))
_ASM32, _CON32 = tl.constexpr(allsum_ptx(32)), tl.constexpr(allsum_constraints(32))


@triton.jit
def lane_allsum(s):
    """`[N, 32]` per-lane partials (lane g on axis 1, one warp) -> `[N, 32]` in which every lane
    holds each column's sum over the 32 lanes, in the butterfly's order (module doc)."""
    N: tl.constexpr = s.shape[0]
    if _INTERPRET:
        t = tl.sum(tl.reshape(s, [N, 2, 16]), 1)  # g ^ 16
        t = tl.sum(tl.reshape(t, [N, 2, 8]), 1)
        t = tl.sum(tl.reshape(t, [N, 2, 4]), 1)
        t = tl.sum(tl.reshape(t, [N, 2, 2]), 1)
        t = tl.sum(t, 1)                           # g ^ 1
        r = tl.broadcast_to(t[:, None], [N, 32])
    elif N == 1:
        r = tl.inline_asm_elementwise(_ASM1, _CON1, [s], dtype=tl.float32, is_pure=True, pack=1)
    elif N == 2:
        r = tl.inline_asm_elementwise(_ASM2, _CON2, [s], dtype=tl.float32, is_pure=True, pack=2)
    elif N == 4:
        r = tl.inline_asm_elementwise(_ASM4, _CON4, [s], dtype=tl.float32, is_pure=True, pack=4)
    elif N == 8:
        r = tl.inline_asm_elementwise(_ASM8, _CON8, [s], dtype=tl.float32, is_pure=True, pack=8)
    elif N == 16:
        r = tl.inline_asm_elementwise(_ASM16, _CON16, [s], dtype=tl.float32, is_pure=True, pack=16)
    else:
        tl.static_assert(N == 32, "lane_allsum takes 1, 2, 4, 8, 16 or 32 columns")
        r = tl.inline_asm_elementwise(_ASM32, _CON32, [s], dtype=tl.float32, is_pure=True, pack=32)
    return r
