"""The split checkpoint layout: an fp32 checkpoint stored as two 16-bit planes, same bytes.

Every decode step of a non-flush row reads its whole fp32 checkpoint (`[HV, V, K]`, 64 KiB per
head at K = V = 128) only to form outputs. With bf16 activations those outputs end in a bf16
cast, so that read does not need the low mantissa bits; the fold does, bit for bit. The split
layout keeps both without a byte more: a head's `[V, K]` block of fp32 words `x` is stored as

    hi[V*K] (uint16), then lo[V*K] (uint16)
    lo = x & 0xFFFF
    hi = ((x >> 16) + (lo >> 15)) & 0xFFFF     (the high half, rounded by lo's top bit)

so `hi` alone is the bf16 value of `x` (nearest, ties away from zero), and `x` comes back exactly
as `((hi - (lo >> 15)) & 0xFFFF) << 16 | lo` (mod 2^16 arithmetic: a bijection on every bit
pattern, NaN and infinity included). Output-only reads then move half the checkpoint bytes; the
exact paths (flush, fold, commit) read and write both planes (`common.ckpt_load`/`ckpt_store`).

The layout is a property of the pool: every kernel that touches it is told (`split_ckpt=`), and
code that reads the checkpoint as fp32 (SGLang's own kernels) needs it converted first:
`split_ckpt_convert` converts slots in place on the device (one program per head block). The
torch functions `split_ckpt_encode` / `_decode` are the reference the tests hold it to.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import ckpt_join, ckpt_planes

_M16 = 0xFFFF


def check_split_form(split_ckpt: bool, K: int) -> None:
    """Refuse split checkpoints where the exact replay in effect cannot keep them bit-exact
    (`configs.gdn_ckpt_split_form_ok`)."""
    from ..configs import GDN_K_FORMS, gdn_ckpt_split_form_ok, gdn_k_tree

    if split_ckpt and not gdn_ckpt_split_form_ok(K):
        raise ValueError(
            f"split checkpoints need the tree or shuffle form of the exact replay on the GPU (head_k_dim 128, "
            f"REPLAYSSM_CONFIG gdn_k_tree=1 or 2); head_k_dim={K} runs the {GDN_K_FORMS[gdn_k_tree(K)]} form: "
            "use fp32 checkpoints (split_ckpt=False, REPLAYSSM_CONFIG gdn_ckpt_split=0)"
        )


def ckpt_half_reads(act_dtype: torch.dtype) -> bool:
    """Whether output-only reads of a split checkpoint take only its `hi` plane: with bf16
    activations (outputs end in a bf16 cast, which `hi` matches in precision); fp16 and fp32
    activations read the exact value."""
    return act_dtype == torch.bfloat16


def _to_i16(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^16) as the int16 with the same bits."""
    return (x - ((x & 0x8000) << 1)).to(torch.int16)


def split_ckpt_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 `[..., V, K]` -> the split layout's bytes, as an fp32 tensor of the same shape."""
    lead, V, K = x.shape[:-2], x.shape[-2], x.shape[-1]
    bits = x.contiguous().view(torch.int32).reshape(*lead, V * K).long()
    lo = bits & _M16
    hi = ((bits >> 16) + (lo >> 15)) & _M16
    planes = torch.stack([_to_i16(hi), _to_i16(lo)], dim=-2)  # [..., 2, V*K]
    return planes.contiguous().view(torch.float32).reshape(*lead, V, K)


def split_ckpt_decode(y: torch.Tensor) -> torch.Tensor:
    """The split layout's bytes (an fp32 `[..., V, K]` tensor) -> the fp32 values."""
    lead, V, K = y.shape[:-2], y.shape[-2], y.shape[-1]
    planes = y.contiguous().view(torch.int16).reshape(*lead, 2, V * K).long() & _M16
    hi, lo = planes[..., 0, :], planes[..., 1, :]
    top = (hi - (lo >> 15)) & _M16
    bits = (top << 16) | lo
    bits = bits - ((bits & 0x80000000) << 1)
    return bits.to(torch.int32).view(torch.float32).reshape(*lead, V, K)


def split_ckpt_hi(y: torch.Tensor) -> torch.Tensor:
    """The `hi` planes of split-layout bytes as fp32 values (what half reads see)."""
    lead, V, K = y.shape[:-2], y.shape[-2], y.shape[-1]
    hi = y.contiguous().view(torch.int16).reshape(*lead, 2, V * K)[..., 0, :]
    return hi.view(torch.bfloat16).float().reshape(*lead, V, K)


@triton.jit(do_not_specialize=["stride_layer", "stride_slot"])
def _ckpt_convert_kernel(state, slots, stride_layer, stride_slot, HV: tl.constexpr, NVK: tl.constexpr,
                         BLOCK: tl.constexpr, TO_SPLIT: tl.constexpr, ALL: tl.constexpr):
    """One head block of one (layer, slot) per program, converted in place: the whole block is
    read before any of it is written (the two layouts share its bytes across elements)."""
    pid = tl.program_id(0)
    i_l = tl.program_id(1).to(tl.int64)
    i_s = pid // HV
    i_hv = pid % HV
    if ALL:
        slot = i_s.to(tl.int64)
    else:
        slot = tl.load(slots + i_s).to(tl.int64)
        if slot < 0:
            return
    p32 = state + i_l * stride_layer + slot * stride_slot + i_hv * NVK
    p16 = p32.to(tl.pointer_type(tl.uint16))
    o = tl.arange(0, BLOCK)
    m = o < NVK
    if TO_SPLIT:
        hi, lo = ckpt_planes(tl.load(p32 + o, mask=m, other=0))
        tl.debug_barrier()  # every lane has its words before any lane overwrites them
        tl.store(p16 + o, hi, mask=m)
        tl.store(p16 + NVK + o, lo, mask=m)
    else:
        x = ckpt_join(tl.load(p16 + o, mask=m, other=0), tl.load(p16 + NVK + o, mask=m, other=0))
        tl.debug_barrier()
        tl.store(p32 + o, x, mask=m)


def split_ckpt_convert(state: torch.Tensor, slots: Optional[torch.Tensor], to_split: bool) -> None:
    """Convert checkpoints in place on their device: to the split layout (`to_split`) or back to
    fp32. `state`: `[S, HV, V, K]` or `[Lm, S, HV, V, K]` fp32 with contiguous `[HV, V, K]` slots;
    `slots`: int tensor of slot indices (`< 0` skipped), or None for every slot. A slot listed
    twice would be converted twice: the caller passes distinct slots."""
    if state.dim() == 4:
        state = state.unsqueeze(0)
    if state.dim() != 5 or state.dtype != torch.float32 or state[0, 0].stride() != (
            state.shape[3] * state.shape[4], state.shape[4], 1):
        raise ValueError("state must be fp32 [(Lm,) S, HV, V, K] with contiguous [HV, V, K] slots")
    Lm, S, HV, V, K = state.shape
    n = S if slots is None else slots.numel()
    if n == 0 or Lm == 0:
        return
    # One compiled variant per direction and form (a server compiles them at pool creation,
    # `ReplaySSMMambaPool._warm_ckpt_kernels`): int32 slots, no specialisation on counts or strides.
    idx = state if slots is None else slots.reshape(-1).to(torch.int32).contiguous()
    block = triton.next_power_of_2(V * K)
    _ckpt_convert_kernel[(n * HV, Lm)](
        state, idx, state.stride(0), state.stride(1), HV=HV, NVK=V * K, BLOCK=block, TO_SPLIT=bool(to_split),
        ALL=slots is None, num_warps=16 if block >= 8192 else 4,
    )
