"""Device helpers shared by the GDN ReplaySSM kernels.

The two helpers that touch the committed state (`gdn_gate`, `gdn_exact_step`) reproduce the
operation order of SGLang 0.5.17's `fused_sigmoid_gating_delta_rule_update_kernel`:

    g    = -exp(A_log) * softplus(a + dt_bias)      (softplus threshold 20)
    beta = 1 / (1 + exp(-b))                         (fp32)
    k    = k / sqrt(sum(k*k) + 1e-6)
    h   *= exp(g);  v -= sum(h*k, 0);  v *= beta;  h += k v^T

on a `[BK, BV]` state tile with K along axis 0. Do not "simplify" these expressions (reciprocal
multiplies, tl.dot, reordering): the committed state must stay bit-identical to that kernel.

The K-tree form (`TREE`, K = 128, GPU; `configs.gdn_k_tree`). On the H200 that kernel's one-warp
tile gives each thread 4 consecutive K (`4g .. 4g+3`, lane g) of every column. A sum over K is then
the thread's chain over its 4 products, `fma(x3, y3, fma(x2, y2, fma(x0, y0, x1*y1)))` (what the
compiler makes of it), followed by a butterfly across lanes pairing g with g^16, g^8, g^4, g^2,
g^1: 160 shuffles per token for the 32 columns, the replay's bottleneck. The tree form writes
that same association out with explicit `fma`s and pairwise adds, on a tile held as
`[BVF, 4 (lo), 8 (hi), 4 (e)]` with `k = 16*hi + 4*lo + e` (so `g = 4*hi + lo`): the chain and
the first three pairings stay inside a thread, the last two cost 2 shuffles per column. The bits
no longer depend on the layout the compiler picks, only on the written order, which is the
baseline's. Keys are normalised the same way (`gdn_l2norm_rows`) by every kernel that writes the
fp32 `k` ring, so the tree-form replay reads normalised keys from that ring instead of normalising
raw keys again. The GPU tests check every step against SGLang's kernel. Under the interpreter the
baseline's own sums are numpy's, so there the plain form (SGLang's expressions) is the one that
matches, and the tree form is checked against a numpy model of the GPU order instead.

The shuffle form (`TREE` = 2, same keys and order as the tree form): the state tile is held as
SGLang's kernel holds it, each lane with its 4 keys of every column (`[BVF, BK]`, K along axis 1,
one warp), the per-lane chains are written out as in the tree form, and the sums across lanes
come from `lanes.lane_allsum`: 17 shuffles per entry for 8 columns instead of the butterfly's 40,
with the butterfly's pairings, and the key is not replicated across lanes.
"""

import triton
import triton.language as tl

from .lanes import lane_allsum


# -- checkpoint layouts ---------------------------------------------------------------------------
# A head's `[V, K]` fp32 checkpoint block is stored either as fp32 (SGLang's layout) or, with
# `SPLIT`, as two 16-bit planes over the same bytes: `hi[V*K]` then `lo[V*K]` (`gdn/ckpt.py`).
# `lo` is the low half of each fp32 word and `hi` its high half rounded by `lo`'s top bit, so `hi`
# read alone is the bf16 value of the element (nearest, ties away from zero) and `(hi, lo)` gives
# back the fp32 word exactly. Offsets are element offsets inside the head block.


@triton.jit
def ckpt_load(p_head, o_h, mask, NVK: tl.constexpr, SPLIT: tl.constexpr, HALF: tl.constexpr = False,
              EVICT: tl.constexpr = False, WIDEN: tl.constexpr = True):
    """fp32 tile of the head block `p_head` (an fp32 pointer) at offsets `o_h`. With `SPLIT` and
    `HALF` only the `hi` plane is read: the bf16 value of each element (output-only reads with
    bf16 activations), as bf16 itself when not `WIDEN` (a tensor-core operand); else the exact
    fp32 value."""
    if not WIDEN:
        tl.static_assert(SPLIT and HALF, "ckpt_load: a bf16 tile needs SPLIT and HALF")
    if SPLIT:
        p16 = p_head.to(tl.pointer_type(tl.uint16))
        hi = tl.load(p16 + o_h, mask=mask, other=0, eviction_policy="evict_first" if EVICT else "")
        if HALF:
            x = hi.to(tl.bfloat16, bitcast=True)
            if WIDEN:
                x = x.to(tl.float32)
        else:
            x = ckpt_join(hi, tl.load(p16 + NVK + o_h, mask=mask, other=0,
                                      eviction_policy="evict_first" if EVICT else ""))
    else:
        x = tl.load(p_head + o_h, mask=mask, other=0, eviction_policy="evict_first" if EVICT else "")
    return x


@triton.jit
def ckpt_join(hi, lo):
    """The fp32 words of `(hi, lo)` 16-bit planes."""
    lo32 = lo.to(tl.uint32)
    top = (hi.to(tl.uint32) - (lo32 >> 15)) & 0xFFFF
    return ((top << 16) | lo32).to(tl.float32, bitcast=True)


@triton.jit
def ckpt_planes(x):
    """The `(hi, lo)` 16-bit planes (uint16) of the fp32 tile `x`; `ckpt_join` inverts it."""
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    lo = bits & 0xFFFF
    hi = ((bits >> 16) + (lo >> 15)) & 0xFFFF
    return hi.to(tl.uint16), lo.to(tl.uint16)


@triton.jit
def ckpt_store(p_head, o_h, x, mask, NVK: tl.constexpr, SPLIT: tl.constexpr):
    """Store the fp32 tile `x` into the head block `p_head` at offsets `o_h` (see `ckpt_load`)."""
    if SPLIT:
        p16 = p_head.to(tl.pointer_type(tl.uint16))
        hi, lo = ckpt_planes(x)
        tl.store(p16 + o_h, hi, mask=mask)
        tl.store(p16 + NVK + o_h, lo, mask=mask)
    else:
        tl.store(p_head + o_h, x.to(p_head.dtype.element_ty), mask=mask)


@triton.jit
def gdn_gate(b_a, b_b, b_A_log, b_dt_bias, softplus_beta, softplus_threshold):
    """Per-token log-decay `g` and write strength `beta` (scalars or vectors, fp32)."""
    x = b_a + b_dt_bias
    beta_x = softplus_beta * x
    softplus_x = tl.where(
        beta_x <= softplus_threshold,
        (1.0 / softplus_beta) * tl.log(1.0 + tl.exp(beta_x)),
        x,
    )
    b_g = -tl.exp(b_A_log) * softplus_x
    b_beta = 1.0 / (1.0 + tl.exp(-b_b))
    return b_g, b_beta


@triton.jit
def gdn_token_gate(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_b_row, softplus_beta, softplus_threshold):
    """`gdn_gate` of one decode token: row `i_n`'s `a` and `b` of value head `i_hv`, and that
    head's `A_log` and `dt_bias` (scalars, fp32)."""
    return gdn_gate(tl.load(a + i_n * stride_a_row + i_hv).to(tl.float32),
                    tl.load(b + i_n * stride_b_row + i_hv).to(tl.float32),
                    tl.load(A_log + i_hv).to(tl.float32), tl.load(dt_bias + i_hv).to(tl.float32),
                    softplus_beta, softplus_threshold)


@triton.jit
def gdn_tile_ids(H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """(V tile, row, value head, key head) of a program on grid axis 0 = `cdiv(V, BV) * B * HV`."""
    NV = (V + BV - 1) // BV
    i_v, i_nh = tl.program_id(0) % NV, tl.program_id(0) // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    return i_v, i_n, i_hv, i_hv // (HV // H)


@triton.jit
def gdn_l2norm(b_x):
    """Division-form L2 normalisation with eps inside the sqrt (SGLang's in-kernel norm)."""
    return b_x / (tl.sqrt(tl.sum(b_x * b_x) + 1e-6))


@triton.jit
def history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL: tl.constexpr):
    """`(w, G)` of the committed entries of value head `i_hv`: `w_j = exp(G - G_j)` (`G_j` the
    cumulative log-decay through entry j, `G` the total; zero past the entries) and `G`."""
    b_gr = tl.load(ring_g + slot * stride_g_slot + i_hv * RL + phys_j, mask=m_j, other=0)
    b_gtot = tl.sum(b_gr, 0)
    return tl.where(m_j, tl.exp(b_gtot - tl.cumsum(b_gr, 0)), 0.0), b_gtot


@triton.jit
def history_rows(ring, slot, stride_slot, i_head, phys_j, m_j, o_c, mask_c, C: tl.constexpr, RL: tl.constexpr):
    """The committed entries of head `i_head` in a `C`-wide ring (`k` or `d`) as `[RLB, BC]` fp32 rows,
    zero past the entries."""
    return tl.load(ring + slot * stride_slot + (i_head * RL + phys_j)[:, None] * C + o_c[None, :],
                   mask=m_j[:, None] & mask_c[None, :], other=0).to(tl.float32)


@triton.jit
def gdn_ring_append_gate_keys(ring_g, ring_beta, ring_k, ring_rawk, stride_g_slot, stride_beta_slot, stride_k_slot,
                              stride_rawk_slot, slot, phys, i_v, i_hv, i_h, b_g, b_beta, b_kn, b_kraw, o_k, mask_k,
                              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, RL: tl.constexpr,
                              RAW_K: tl.constexpr):
    """A decode token's per-head ring entries at physical position `phys`, each by one program:
    `g` and `beta` by the first V tile of each value head, the normalised key `b_kn` (and the raw
    key `b_kraw` where the rings keep it, `RAW_K`) by the first V tile of each key head's first
    value head."""
    if i_v == 0:
        tl.store(ring_g + slot * stride_g_slot + i_hv * RL + phys, b_g)
        tl.store(ring_beta + slot * stride_beta_slot + i_hv * RL + phys, b_beta)
        if i_hv % (HV // H) == 0:
            tl.store(ring_k + slot * stride_k_slot + (i_h * RL + phys) * K + o_k, b_kn.to(ring_k.dtype.element_ty),
                     mask=mask_k)
            if RAW_K:
                tl.store(ring_rawk + slot * stride_rawk_slot + (i_h * RL + phys) * K + o_k, b_kraw, mask=mask_k)


@triton.jit
def gdn_exact_step(b_h, b_k, b_v, b_g, b_beta):
    """One recurrent step on a `[BK, BV]` fp32 tile.

    `b_k` is the raw (pre-norm) key `[BK]` in fp32, `b_v` the raw value block `[BV]` in fp32.
    Returns the updated tile and the normalised key.
    """
    b_k = gdn_l2norm(b_k)
    b_h *= tl.exp(b_g)
    b_v -= tl.sum(b_h * b_k[:, None], 0)
    b_v *= b_beta
    b_h += b_k[:, None] * b_v[None, :]
    return b_h, b_k


@triton.jit
def gdn_k_offsets(BK: tl.constexpr, TREE: tl.constexpr):
    """Offsets along K of a state tile: `[BK]`, or for the tree form `[4 (lo), 8 (hi), 4 (e)]` =
    `16*hi + 4*lo + e`. Keys and queries are loaded as `[BK]` either way (see `gdn_l2norm_k`)."""
    if TREE == 1:
        o_lo = tl.arange(0, 4)
        o_hi = tl.arange(0, 8)
        o_e = tl.arange(0, 4)
        return o_lo[:, None, None] * 4 + o_hi[None, :, None] * 16 + o_e[None, None, :]
    else:
        return tl.arange(0, BK)


@triton.jit
def gdn_state_offsets(o_k, o_v, mask_k, mask_v, K: tl.constexpr, TREE: tl.constexpr):
    """(offsets, mask) of a `[V, K]` state block's tile: `[BK, BVF]`, `[BVF, 4, 8, 4]` (tree) or
    `[BVF, BK]` (shuffle form)."""
    if TREE == 1:
        return o_v[:, None, None, None] * K + o_k[None, :, :, :], mask_v[:, None, None, None] & mask_k[None, :, :, :]
    elif TREE == 2:
        return o_v[:, None] * K + o_k[None, :], mask_v[:, None] & mask_k[None, :]
    else:
        return o_v[None, :] * K + o_k[:, None], mask_k[:, None] & mask_v[None, :]


@triton.jit
def _chain4(x0, x1, x2, x3, y0, y1, y2, y3):
    """One thread's sum of its 4 products, as the baseline compiles it."""
    return tl.fma(x3, y3, tl.fma(x2, y2, tl.fma(x0, y0, x1 * y1)))


@triton.jit
def _split4(x):
    """`[R, 32, 4]` -> its 4 slices along the last axis (`[R, 32]` each)."""
    R: tl.constexpr = x.shape[0]
    a, b = tl.split(tl.reshape(x, [R, 32, 2, 2]))  # a: e = 0, 2; b: e = 1, 3
    x0, x2 = tl.split(a)
    x1, x3 = tl.split(b)
    return x0, x1, x2, x3


@triton.jit
def _split_e(x):
    """`[N, 4, 8, 4]` -> its 4 slices along the last axis (`[N, 4, 8]` each)."""
    N: tl.constexpr = x.shape[0]
    x0, x1, x2, x3 = _split4(tl.reshape(x, [N, 32, 4]))
    return (tl.reshape(x0, [N, 4, 8]), tl.reshape(x1, [N, 4, 8]), tl.reshape(x2, [N, 4, 8]),
            tl.reshape(x3, [N, 4, 8]))


@triton.jit
def gdn_tree_dot(h, x):
    """Per-column sum over K of `h * x` in the baseline's order (module doc): `h` is a
    `[N, 4 (lo), 8 (hi), 4 (e)]` tile, `x` a `[4, 8, 4]` key / query. Every step is written out
    (each thread's 4-product chain, then pairwise adds), so the bits do not depend on the layout
    the compiler picks. Returns `[N]`."""
    N: tl.constexpr = h.shape[0]
    h0, h1, h2, h3 = _split_e(h)
    x0, x1, x2, x3 = _split_e(x[None, :, :, :])
    s = _chain4(h0, h1, h2, h3, x0, x1, x2, x3)  # [N, lo, hi]; lane group g = 4*hi + lo
    s = tl.sum(tl.reshape(s, [N, 4, 2, 4]), 2)  # g ^ 16
    s = tl.sum(tl.reshape(s, [N, 4, 2, 2]), 2)  # g ^ 8
    s = tl.sum(s, 2)                            # g ^ 4
    s = tl.sum(tl.reshape(s, [N, 2, 2]), 1)     # g ^ 2
    return tl.sum(s, 1)                         # g ^ 1


@triton.jit
def gdn_l2norm_rows(x, TREE: tl.constexpr):
    """Row-wise `gdn_l2norm` of an fp32 `[R, BK]` block. With TREE (K = 128) the sum of squares
    is written out in the baseline's order (as in `gdn_tree_dot`), so any kernel, whatever its
    layout, gets the bits SGLang's kernel computes for that key."""
    if TREE:
        R: tl.constexpr = x.shape[0]
        x0, x1, x2, x3 = _split4(tl.reshape(x, [R, 32, 4]))  # [row, g] for each e
        s = _chain4(x0, x1, x2, x3, x0, x1, x2, x3)
        s = tl.sum(tl.reshape(s, [R, 2, 16]), 1)  # g ^ 16
        s = tl.sum(tl.reshape(s, [R, 2, 8]), 1)
        s = tl.sum(tl.reshape(s, [R, 2, 4]), 1)
        s = tl.sum(tl.reshape(s, [R, 2, 2]), 1)
        s = tl.sum(s, 1)                          # g ^ 1
        return x / (tl.sqrt(s + 1e-6))[:, None]
    else:
        return x / (tl.sqrt(tl.sum(x * x, 1) + 1e-6))[:, None]


@triton.jit
def gdn_l2norm_vec(b_x, TREE: tl.constexpr):
    """`gdn_l2norm` of a `[BK]` vector; with TREE as `gdn_l2norm_rows` (the baseline's bits)."""
    if TREE:
        return tl.reshape(gdn_l2norm_rows(tl.reshape(b_x, [1, 128]), TREE), [128])
    else:
        return gdn_l2norm(b_x)


@triton.jit
def gdn_tree_vec(b_x):
    """A `[128]` vector rearranged as `[4 (lo), 8 (hi), 4 (e)]` (`gdn_k_offsets`)."""
    return tl.permute(tl.reshape(b_x, [8, 4, 4]), [1, 0, 2])


@triton.jit
def gdn_tree_step(b_h, b_kn, b_v, b_g, b_beta):
    """`gdn_exact_step` on a `[BVF, 4, 8, 4]` tile with an already normalised `[4, 8, 4]` key."""
    b_h *= tl.exp(b_g)
    b_v -= gdn_tree_dot(b_h, b_kn)
    b_v *= b_beta
    b_h += b_kn[None, :, :, :] * b_v[:, None, None, None]
    return b_h


@triton.jit
def gdn_shfl_dot(h, x):
    """Per-column sum over K of `h * x` in the baseline's order, for a `[N, 128]` tile held as the
    baseline holds it (lane g: K = 4g .. 4g+3): each lane's 4-product chain, then
    `lanes.lane_allsum`. `x` is a `[128]` key / query. Returns `[N, 32]`, the sum in every lane."""
    N: tl.constexpr = h.shape[0]
    h0, h1, h2, h3 = _split4(tl.reshape(h, [N, 32, 4]))
    x0, x1, x2, x3 = _split4(tl.reshape(x, [1, 32, 4]))
    return lane_allsum(_chain4(h0, h1, h2, h3, x0, x1, x2, x3))


@triton.jit
def gdn_shfl_step(b_h, b_kn, b_v, b_g, b_beta):
    """`gdn_exact_step` on a `[BVF, 128]` tile (shuffle form) with an already normalised `[128]` key."""
    N: tl.constexpr = b_h.shape[0]
    b_h *= tl.exp(b_g)
    b_u = b_v[:, None] - gdn_shfl_dot(b_h, b_kn)  # [N, 32]: the same value in every lane
    b_u *= b_beta
    b_h3 = tl.reshape(b_h, [N, 32, 4])
    b_h3 += tl.reshape(b_kn, [1, 32, 4]) * b_u[:, :, None]
    return tl.reshape(b_h3, [N, 128])


@triton.jit
def _gdn_replay_load(p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, phys, K: tl.constexpr, V: tl.constexpr,
                     TREE: tl.constexpr):
    """The ring inputs of the entry at physical index `phys`: `(k, v, g, beta)`, `k` raw (plain
    form) or normalised fp32 (the tree and shuffle forms)."""
    b_rv = tl.load(p_rv + phys * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_rg = tl.load(p_rg + phys)
    b_rb = tl.load(p_rb + phys)
    if TREE:
        # The fp32 `k` ring: every writer normalised it with gdn_l2norm_rows(TREE), i.e. exactly.
        b_rk = tl.load(p_rk + phys * K + o_k)
    else:
        b_rk = tl.load(p_rk + phys * K + o_k, mask=mask_k, other=0).to(tl.float32)
    return b_rk, b_rv, b_rg, b_rb


@triton.jit
def _gdn_replay_apply(b_h, b_rk, b_rv, b_rg, b_rb, TREE: tl.constexpr):
    """One exact step of the state tile on loaded ring inputs (`_gdn_replay_load`)."""
    if TREE == 1:
        b_h = gdn_tree_step(b_h, b_rk, b_rv, b_rg, b_rb)
    elif TREE == 2:
        b_h = gdn_shfl_step(b_h, b_rk, b_rv, b_rg, b_rb)
    else:
        b_h, b_rk = gdn_exact_step(b_h, b_rk, b_rv, b_rg, b_rb)
    return b_h


@triton.jit
def _gdn_replay_entry(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, phys, K: tl.constexpr, V: tl.constexpr,
                      TREE: tl.constexpr):
    b_rk, b_rv, b_rg, b_rb = _gdn_replay_load(p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, phys, K, V, TREE)
    return _gdn_replay_apply(b_h, b_rk, b_rv, b_rg, b_rb, TREE)


@triton.jit
def gdn_replay(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, org, n, p_snap, o_h, snap_at, mask_h,
               K: tl.constexpr, V: tl.constexpr, RL: tl.constexpr, UNROLL: tl.constexpr, HAS_SNAP: tl.constexpr,
               TREE: tl.constexpr = False, SPLIT: tl.constexpr = False):
    """Replay ring entries `0..n-1` (physical `(org + j) % RL`) into the state tile, exactly
    (`[BK, BVF]`, `[BVF, 4, 8, 4]` in the tree form, `[BVF, BK]` in the shuffle form; `o_k` /
    `p_snap` laid out to match).

    `p_rk` / `p_rv` point at this key / value head's raw-k (tree form: normalised fp32 `k`) / raw-v
    ring row 0 (no column offsets),
    `p_rg` / `p_rb` at its g / beta ring. Whole chunks of `UNROLL` entries are straight-line code
    (their loads need not wait on the state chain); the remainder runs one entry at a time. With
    HAS_SNAP the tile after entry `snap_at - 1` is also stored into the head block `p_snap` at
    offsets `o_h` (radix track; `SPLIT`: the checkpoint layout, `ckpt_store`).
    """
    n_main = (n // UNROLL) * UNROLL
    for j0 in range(0, n_main, UNROLL):
        for u in tl.static_range(UNROLL):
            b_h = _gdn_replay_entry(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, (org + j0 + u) % RL,
                                    K, V, TREE)
            if HAS_SNAP:
                if j0 + u + 1 == snap_at:
                    ckpt_store(p_snap, o_h, b_h, mask_h, K * V, SPLIT)
    if UNROLL > 1:
        for j in range(n_main, n):
            b_h = _gdn_replay_entry(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, (org + j) % RL,
                                    K, V, TREE)
            if HAS_SNAP:
                if j + 1 == snap_at:
                    ckpt_store(p_snap, o_h, b_h, mask_h, K * V, SPLIT)
    return b_h


@triton.jit
def _gdn_replayed_tile(p_hs, p_rk, p_rv, p_rg, p_rb, o_k, mask_k, o_v, org, n, K: tl.constexpr, V: tl.constexpr,
                       RL: tl.constexpr, UNROLL: tl.constexpr, TREE: tl.constexpr, SPLIT: tl.constexpr):
    """The state sub-tile of value rows `o_v` of the head block `p_hs`, loaded and advanced by the
    pending entries `0..n-1` (`gdn_replay`): `(tile, its offsets, mask, mask_v)`."""
    mask_v = o_v < V
    o_h, mask_h = gdn_state_offsets(o_k, o_v, mask_k, mask_v, K, TREE)
    b_h = ckpt_load(p_hs, o_h, mask_h, K * V, SPLIT).to(tl.float32)
    b_h = gdn_replay(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, org, n, p_hs, o_h, 0, mask_h,
                     K, V, RL, UNROLL, False, TREE)
    return b_h, o_h, mask_h, mask_v


@triton.jit
def gdn_decode_flush(
    p_hs, p_vin, p_o, p_q, p_k, p_rk, p_rv, p_rg, p_rb, b_g, b_beta, wp, org, i_v, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr,
    RL: tl.constexpr, UNROLL: tl.constexpr, TREE: tl.constexpr, SPLIT: tl.constexpr = False,
):
    """A decode flush row's `[BV]` columns of one value head: exact replay of the pending entries,
    then of this token, then the baseline's readout; one BVF-column sub-tile at a time
    (per-column arithmetic is independent of BVF). `p_hs` is the head's state block, `p_q` / `p_k`
    this token's raw query / key, `p_rk` the raw-k ring (TREE: the normalised `k` ring), `p_rv`,
    `p_rg`, `p_rb` the other rings, all at the head's row 0. The plain form needs a one-warp launch.
    `SPLIT`: the checkpoint layout (`ckpt_load`); the state is read and written exactly either way."""
    o_kq = tl.arange(0, BK)
    b_k = tl.load(p_k + o_kq, mask=o_kq < K, other=0).to(tl.float32)
    b_q = tl.load(p_q + o_kq, mask=o_kq < K, other=0).to(tl.float32)
    b_q = gdn_l2norm_vec(b_q, TREE)
    b_q = b_q * scale
    if TREE == 1:
        b_k = gdn_tree_vec(gdn_l2norm_vec(b_k, TREE))
        b_q = gdn_tree_vec(b_q)
    elif TREE == 2:
        b_k = gdn_l2norm_vec(b_k, TREE)
    o_k = gdn_k_offsets(BK, TREE)
    mask_k = o_k < K
    for i_f in tl.static_range(BV // BVF):
        o_v = i_v * BV + i_f * BVF + tl.arange(0, BVF)
        b_h, o_h, mask_h, mask_v = _gdn_replayed_tile(p_hs, p_rk, p_rv, p_rg, p_rb, o_k, mask_k, o_v, org, wp, K, V,
                                                      RL, UNROLL, TREE, SPLIT)
        b_v = tl.load(p_vin + o_v, mask=mask_v, other=0).to(tl.float32)
        b_h = _gdn_replay_apply(b_h, b_k, b_v, b_g, b_beta, TREE)  # this token, as a replayed entry
        if TREE == 2:
            o_g = tl.arange(0, 32)
            # [BVF, 32], the same in every lane: lane 0 stores it.
            tl.store(p_o + o_v[:, None] + o_g[None, :] * 0, gdn_shfl_dot(b_h, b_q).to(p_o.dtype.element_ty),
                     mask=mask_v[:, None] & (o_g[None, :] == 0))
        elif TREE == 1:
            tl.store(p_o + o_v, gdn_tree_dot(b_h, b_q).to(p_o.dtype.element_ty), mask=mask_v)
        else:
            tl.store(p_o + o_v, tl.sum(b_h * b_q[:, None], 0).to(p_o.dtype.element_ty), mask=mask_v)
        ckpt_store(p_hs, o_h, b_h, mask_h, K * V, SPLIT)
