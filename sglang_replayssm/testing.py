"""Conformance harnesses: drive the ReplaySSM kernels through the same ring/cursor protocol as
the SGLang backend (docs/design.md), for one SSM layer and a fixed batch of requests.

The harness keeps a small slot pool with one spare slot on each side and maps row `i` to slot
`batch - i` (reversed), so slot indirection is exercised and the spare slots can be checked for
stray writes. Nothing here re-implements the kernels in torch.
"""

from __future__ import annotations

from typing import Optional

import torch

from replayssm_kernels import commit_prepare, decode_order_and_index, decode_prepare, pending_fold_plan
from replayssm_kernels.configs import gdn_ckpt_split_for, gdn_flush_phase, gdn_flush_spread
from replayssm_kernels.gdn.ckpt import split_ckpt_convert
from replayssm_kernels.gdn import (
    alloc_gdn_rings,
    gdn_commit,
    gdn_keeps_raw_keys,
    gdn_replay_decode,
    gdn_replay_fold,
    gdn_replay_verify,
)
from replayssm_kernels.mamba2 import (
    alloc_mamba2_rings,
    mamba2_replay_decode,
    mamba2_replay_fold,
    mamba2_replay_verify,
)

__all__ = ["GDNHarness", "Mamba2Harness"]


class _RingHarness:
    """Slot pool, cursors and the decode / verify / commit sequencing shared by both families."""

    def __init__(self, *, batch: int, ring_len: int, max_draft_tokens: int, device) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if ring_len < 1:
            raise ValueError(f"ring_len must be >= 1, got {ring_len}")
        if max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {max_draft_tokens}")
        if ring_len < max_draft_tokens:
            raise ValueError(
                f"ring_len={ring_len} is too small for max_draft_tokens={max_draft_tokens}: a verify "
                f"window of up to {max_draft_tokens} drafts must fit an empty ring "
                f"(ring_len >= max_draft_tokens)"
            )
        self.batch = batch
        self.ring_len = ring_len
        self.max_draft_tokens = max_draft_tokens
        self.device = torch.device(device)
        self.num_slots = batch + 2
        self.slot_idx = torch.arange(batch, 0, -1, dtype=torch.int32, device=self.device)
        self.wpos = torch.zeros(self.num_slots, dtype=torch.int32, device=self.device)
        self.origin = torch.zeros(self.num_slots, dtype=torch.int32, device=self.device)
        # The one-launch GDN commit's per-slot ticket counters (the pool keeps the same).
        self.tickets = torch.zeros(self.num_slots, dtype=torch.int32, device=self.device)
        self._mode: Optional[str] = None
        self._pending_verify: Optional[int] = None
        # Decode steps run (the phase counter of configs.gdn_flush_phase); GDNHarness turns it on.
        self._flush_phase = False
        self._decode_steps = 0
        self._act_dtype: Optional[torch.dtype] = None

    # -- sequencing -------------------------------------------------------------------------
    def _enter(self, mode: str) -> None:
        if self._mode is not None and self._mode != mode:
            raise RuntimeError(f"this harness already ran {self._mode}; decode and verify are not mixed")
        self._mode = mode

    def _check_dtype(self, dtype: torch.dtype) -> bool:
        """Rings live in the activation dtype; returns True when they must be (re)allocated."""
        if self._act_dtype == dtype:
            return False
        if self._act_dtype is not None and bool((self.wpos != 0).any()):
            raise RuntimeError(f"activation dtype changed from {self._act_dtype} to {dtype} with pending ring entries")
        self._act_dtype = dtype
        return True

    def _decode_plan(self, force_flush: Optional[torch.Tensor]):
        if self._pending_verify is not None:
            raise RuntimeError("commit() must follow every verify()")
        self._enter("decode")
        if force_flush is not None:
            force_flush = torch.as_tensor(force_flush, device=self.device).to(torch.int32).contiguous()
        phase = self._decode_steps if self._flush_phase else None  # as the backend (common.py)
        self._decode_steps += 1
        return decode_prepare(self.slot_idx, self.wpos, self.ring_len, force_flush=force_flush, phase_step=phase)

    def _verify_begin(self, T: int) -> None:
        if self._pending_verify is not None:
            raise RuntimeError("commit() must follow every verify()")
        if not 1 <= T <= self.max_draft_tokens:
            raise ValueError(f"verify takes 1..{self.max_draft_tokens} drafts per row, got {T}")
        self._enter("verify")
        self._pending_verify = T

    def _commit_plan(self, num_accepted) -> tuple[torch.Tensor, torch.Tensor]:
        acc = self._accepted(num_accepted)
        return commit_prepare(self.slot_idx, self.wpos, self.origin, acc, self.ring_len, self.max_draft_tokens)

    def _accepted(self, num_accepted) -> torch.Tensor:
        """`num_accepted` checked against the pending verify, as `[batch]` int32; ends the verify."""
        if self._pending_verify is None:
            raise RuntimeError("commit() without a preceding verify()")
        acc = torch.as_tensor(num_accepted, device=self.device).to(torch.int32).reshape(-1).contiguous()
        if acc.shape[0] != self.batch:
            raise ValueError(f"num_accepted must have {self.batch} entries, got {acc.shape[0]}")
        T = self._pending_verify
        if bool(((acc < 1) | (acc > T)).any()):
            raise ValueError(f"num_accepted must be in 1..{T}, got {acc.tolist()}")
        self._pending_verify = None
        return acc

    def _reset_cursors(self) -> None:
        self.wpos.zero_()
        self.origin.zero_()
        self._pending_verify = None


class GDNHarness(_RingHarness):
    """One GDN layer over `batch` requests.

    `A_log`, `dt_bias`: fp32 `[HV]`. Activations (q, k, v, a, b) may be bf16, fp16 or fp32; the
    rings take the activation dtype of the first decode/verify call. Whether they keep raw keys is
    decided here, by the replay form in effect at construction (as the pool's is at allocation).
    """

    def __init__(
        self, *, batch: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
        A_log: torch.Tensor, dt_bias: torch.Tensor, ring_len: int, max_draft_tokens: int, device,
    ) -> None:
        super().__init__(batch=batch, ring_len=ring_len, max_draft_tokens=max_draft_tokens, device=device)
        if num_v_heads % num_k_heads != 0:
            raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of num_k_heads={num_k_heads}")
        self.H, self.HV, self.K, self.V = num_k_heads, num_v_heads, head_k_dim, head_v_dim
        self.A_log = A_log.to(device=self.device, dtype=torch.float32).contiguous()
        self.dt_bias = dt_bias.to(device=self.device, dtype=torch.float32).contiguous()
        if self.A_log.shape != (self.HV,) or self.dt_bias.shape != (self.HV,):
            raise ValueError(f"A_log and dt_bias must be [{self.HV}]")
        self._state = torch.zeros(1, self.num_slots, self.HV, self.V, self.K, dtype=torch.float32, device=self.device)
        self._rings = None
        self._raw_keys = gdn_keeps_raw_keys(self.K)
        # Read once, as the backend's batch state reads them (backends/common.py).
        self._flush_phase = gdn_flush_phase()
        self._flush_spread = gdn_flush_spread()
        # The checkpoint layout (gdn/ckpt.py), fixed for the harness's life as for a pool's.
        self.split_ckpt = gdn_ckpt_split_for(self.K)

    def _rings_for(self, dtype: torch.dtype):
        if self._check_dtype(dtype) or self._rings is None:
            self._rings = alloc_gdn_rings(1, self.num_slots, self.H, self.HV, self.K, self.V,
                                          self.ring_len, dtype, self.device, raw_keys=self._raw_keys)
        return self._rings

    def set_state(self, S0: torch.Tensor) -> None:
        """Load checkpoints `[batch, HV, V, K]` (fp32) and empty the rings."""
        if tuple(S0.shape) != (self.batch, self.HV, self.V, self.K):
            raise ValueError(f"state must be [{self.batch}, {self.HV}, {self.V}, {self.K}], got {tuple(S0.shape)}")
        self._state[0, self.slot_idx.long()] = S0.to(device=self.device, dtype=torch.float32)
        if self.split_ckpt:
            split_ckpt_convert(self._state[0], self.slot_idx, True)  # as a server's pool converts
        self._reset_cursors()

    def decode(self, q, k, v, a, b, force_flush=None) -> torch.Tensor:
        """q, k `[batch, H, K]`; v `[batch, HV, V]`; a, b `[batch, HV]` -> o `[batch, HV, V]`."""
        rings = self._rings_for(k.dtype)
        row_wp, row_flush = self._decode_plan(force_flush)
        # the launch's row order and flush index, as the backend makes them (scheduling only)
        order, findex = decode_order_and_index(row_flush, self._flush_spread)
        return gdn_replay_decode(q, k, v, a, b, self.A_log, self.dt_bias, self._state[0], rings.layer(0),
                                 self.slot_idx, row_wp, row_flush, self.origin, row_order=order,
                                 split_ckpt=self.split_ckpt, flush_index=findex)

    def verify(self, q, k, v, a, b) -> torch.Tensor:
        """The same with a draft axis after batch -> o `[batch, T', HV, V]`."""
        self._verify_begin(k.shape[1])
        rings = self._rings_for(k.dtype)
        return gdn_replay_verify(q, k, v, a, b, self.A_log, self.dt_bias, self._state[0], rings.layer(0),
                                 self.slot_idx, self.wpos, self.origin, split_ckpt=self.split_ckpt)

    def commit(self, num_accepted) -> None:
        """Accept `num_accepted[i]` (1..T') drafts of row i; folds when the next window needs room."""
        gdn_commit(self._state, self._rings, self.slot_idx, self.wpos, self.origin, self._accepted(num_accepted),
                   self.max_draft_tokens, self.tickets, split_ckpt=self.split_ckpt)

    def state(self) -> torch.Tensor:
        """Committed state `[batch, HV, V, K]` fp32: checkpoint + pending entries, exactly folded."""
        if self._rings is None:
            out = self._state[0, self.slot_idx.long()].clone()
        else:
            n, org = pending_fold_plan(self.slot_idx, self.wpos, self.origin)
            out = torch.empty(1, self.batch, self.HV, self.V, self.K, dtype=torch.float32, device=self.device)
            dst_idx = torch.arange(self.batch, dtype=torch.int32, device=self.device)
            gdn_replay_fold(self._state, self._rings, self.slot_idx, n, org, dst=out, dst_idx=dst_idx,
                            split_ckpt=self.split_ckpt)
            out = out[0]
        if self.split_ckpt:
            split_ckpt_convert(out, None, False)
        return out

    # Inspection helpers for tests (not part of the conformance API).
    def checkpoint_pool(self) -> torch.Tensor:
        """The raw checkpoint pool `[slots, HV, V, K]` (in the split layout's bytes when `split_ckpt`)."""
        return self._state[0]

    def pending(self) -> torch.Tensor:
        return self.wpos[self.slot_idx.long()].clone()


class Mamba2Harness(_RingHarness):
    """One Mamba-2 layer over `batch` requests (`dt_softplus=True`, head dim tied).

    `A`, `D`, `dt_bias`: fp32 `[NH]`. Activations (x, dt, B, C, z) may be bf16, fp16 or fp32; x, dt
    and B must share one dtype, which the rings take from the first decode/verify call.
    """

    def __init__(
        self, *, batch: int, num_heads: int, head_dim: int, num_groups: int, state_size: int,
        A: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, ring_len: int, max_draft_tokens: int,
        device,
    ) -> None:
        super().__init__(batch=batch, ring_len=ring_len, max_draft_tokens=max_draft_tokens, device=device)
        if num_groups < 1 or num_heads % num_groups != 0:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_groups={num_groups}")
        self.NH, self.P, self.G, self.N = num_heads, head_dim, num_groups, state_size
        params = {}
        for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
            t = torch.as_tensor(t).to(device=self.device, dtype=torch.float32).contiguous()
            if t.shape != (self.NH,):
                raise ValueError(f"{name} must be [{self.NH}], got {tuple(t.shape)}")
            params[name] = t
        self.A, self.D, self.dt_bias = params["A"], params["D"], params["dt_bias"]
        self._state = torch.zeros(1, self.num_slots, self.NH, self.P, self.N, dtype=torch.float32, device=self.device)
        self._rings = None

    def _rings_for(self, dtype: torch.dtype):
        if self._check_dtype(dtype) or self._rings is None:
            self._rings = alloc_mamba2_rings(1, self.num_slots, self.NH, self.P, self.G, self.N,
                                             self.ring_len, dtype, self.device)
        return self._rings

    def set_state(self, S0: torch.Tensor) -> None:
        """Load checkpoints `[batch, NH, P, N]` (fp32) and empty the rings."""
        if tuple(S0.shape) != (self.batch, self.NH, self.P, self.N):
            raise ValueError(f"state must be [{self.batch}, {self.NH}, {self.P}, {self.N}], got {tuple(S0.shape)}")
        self._state[0, self.slot_idx.long()] = S0.to(device=self.device, dtype=torch.float32)
        self._reset_cursors()

    def decode(self, x, dt, B, C, z=None, force_flush=None) -> torch.Tensor:
        """x `[batch, NH, P]`; dt `[batch, NH]`; B, C `[batch, G, N]`; z `[batch, NH, P]` or None
        -> y `[batch, NH, P]`."""
        rings = self._rings_for(x.dtype)
        row_wp, row_flush = self._decode_plan(force_flush)
        return mamba2_replay_decode(x, dt, B, C, self.A, self.D, self.dt_bias, self._state[0], rings.layer(0),
                                    self.slot_idx, row_wp, row_flush, self.origin, z=z)

    def verify(self, x, dt, B, C, z=None) -> torch.Tensor:
        """The same with a draft axis after batch -> y `[batch, T', NH, P]`."""
        self._verify_begin(x.shape[1])
        rings = self._rings_for(x.dtype)
        return mamba2_replay_verify(x, dt, B, C, self.A, self.D, self.dt_bias, self._state[0], rings.layer(0),
                                    self.slot_idx, self.wpos, self.origin, z=z)

    def commit(self, num_accepted) -> None:
        """Accept `num_accepted[i]` (1..T') drafts of row i; folds when the next window needs room."""
        row_nfold, row_origin = self._commit_plan(num_accepted)
        mamba2_replay_fold(self._state, self._rings, self.A[None], self.dt_bias[None], self.slot_idx,
                           row_nfold, row_origin)

    def state(self) -> torch.Tensor:
        """Committed state `[batch, NH, P, N]` fp32: checkpoint + pending entries, exactly folded."""
        if self._rings is None:
            return self._state[0, self.slot_idx.long()].clone()
        n, org = pending_fold_plan(self.slot_idx, self.wpos, self.origin)
        out = torch.empty(1, self.batch, self.NH, self.P, self.N, dtype=torch.float32, device=self.device)
        dst_idx = torch.arange(self.batch, dtype=torch.int32, device=self.device)
        mamba2_replay_fold(self._state, self._rings, self.A[None], self.dt_bias[None], self.slot_idx, n, org,
                           dst=out, dst_idx=dst_idx)
        return out[0]

    # Inspection helpers for tests (not part of the conformance API).
    def checkpoint_pool(self) -> torch.Tensor:
        return self._state[0]

    def pending(self) -> torch.Tensor:
        return self.wpos[self.slot_idx.long()].clone()
