"""`ReplaySSMMambaPool`: SGLang's mamba pool plus per-slot ReplaySSM rings and cursors.

Installed as `HybridReqToTokenPool.mamba_pool_cls` (runtime hook `pool.class`). Layout, per
slot (all `size + 1` slots, the padding slot included) and SSM layer, see docs/design.md:

    temporal  [Lm, S, HV, V, K] (GDN) / [Lm, S, NH, P, N] (Mamba-2) fp32   the checkpoint
    GDN rings     rssm_d, rssm_k, rssm_g, rssm_rawv, rssm_rawk, rssm_beta   (GDNRings; rssm_rawk has
                  a zero-length ring axis unless the plain replay form is in effect at allocation)
    Mamba-2 rings rssm_x [Lm, S, NH, L, P], rssm_B [Lm, S, G, L, N], rssm_dt [Lm, S, NH, L]
    cursors   replayssm_wpos, replayssm_origin  [S] int32, shared by all layers
              (replayssm_tickets [S] int32: the one-launch GDN commit's counters, 0 between launches)

The ring tensors are fields of the pool's `State` (so `mamba2_layer_cache(i)` slices them per
layer like conv/temporal, and PD transfer skips them via `_NON_TRANSFER_STATE_FIELDS`), and the
same tensors are exposed as one all-layer object, `replayssm_rings` (`GDNRings` /
`Mamba2Rings`). SGLang's own `replayssm_*` fields and `enable_linear_replayssm*` flags stay
None/False: setting them would switch upstream code paths on.

Speculative decoding: `intermediate_ssm` is never allocated (the ring replaces the per-draft
state snapshots); `intermediate_conv_window` is, since conv rollback still uses it.

Cursor lifecycle (an empty ring is `wpos = origin = 0`; ring contents are then ignored):

    any slot allocation   MambaSlotAllocator._do_alloc (hook pool.slot_alloc_reset) reset
                          (working slots, ping-pong track slots, lazy track slots,
                          radix copy-on-write / donation slots: every slot that
                          leaves the free list, whatever its previous life)
    slot allocation       HybridReqToTokenPool.alloc (hook pool.alloc_reset)     reset
    clear_slots           new request without prefix hit                          reset
    copy_from (COW)       dst := src checkpoint with src's pending entries        dst reset
                          folded in (exact fold), so dst is materialised
    extra_buffer donation donate_mamba_ping_pong_slot (hook pool.donate_reset)    both slots reset
    get/load_cpu_copy     rings + cursors travel with conv/temporal               restored
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache.memory_pool import MambaPool, conv_window_dedup_enabled

logger = logging.getLogger("sglang_replayssm")

_GIB = float(1 << 30)
_MIB = float(1 << 20)

# State field name for each ring, per family (kernel ring-object field -> pool State field).
GDN_RING_FIELDS = {
    "d": "rssm_d",
    "k": "rssm_k",
    "g": "rssm_g",
    "rawv": "rssm_rawv",
    "rawk": "rssm_rawk",
    "beta": "rssm_beta",
}
MAMBA2_RING_FIELDS = {"x": "rssm_x", "B": "rssm_B", "dt": "rssm_dt"}
RING_FIELDS = {"gdn": GDN_RING_FIELDS, "mamba2": MAMBA2_RING_FIELDS}
RING_FIELD_NAMES = frozenset(GDN_RING_FIELDS.values()) | frozenset(MAMBA2_RING_FIELDS.values())

CURSOR_BYTES_PER_SLOT = 3 * 4  # replayssm_wpos, replayssm_origin, replayssm_tickets: int32


# ------------------------------------------------------------------------------ build context


@dataclass(frozen=True)
class PoolBuildContext:
    """What the pool needs beyond SGLang's constructor arguments."""

    family: str  # "gdn" | "mamba2"
    ring_len: int
    act_dtype: torch.dtype  # model (activation) dtype: the rings store raw activations
    max_draft_tokens: Optional[int] = None


_BUILD: contextvars.ContextVar[Optional[PoolBuildContext]] = contextvars.ContextVar(
    "replayssm_pool_build", default=None
)


@contextlib.contextmanager
def pool_build_context(ctx: PoolBuildContext):
    """Make `ctx` visible to `ReplaySSMMambaPool.__init__` (set by the `pool.build_context`
    hook around `KVCacheConfigurator._build_hybrid_req_pool`; tests set it directly)."""
    if ctx.family not in RING_FIELDS:
        raise ValueError(f"unknown ReplaySSM family {ctx.family!r}")
    token = _BUILD.set(ctx)
    try:
        yield ctx
    finally:
        _BUILD.reset(token)


# ------------------------------------------------------------------------------ geometry


def ring_dims(family: str, cache_params) -> dict:
    """Per-TP-rank head geometry of the rings, from SGLang's cache params.

    GDN: temporal = (HV, V, K), key heads H = `num_k_heads_per_tp`.
    Mamba-2: temporal = (NH, P, N); groups per rank G from the conv width
    (conv_dim = NH*P + 2*G*N per rank, which includes groups replicated for TP).
    """
    shape = cache_params.shape
    if family == "gdn":
        HV, V, K = shape.temporal
        return {"H": int(shape.num_k_heads_per_tp), "HV": int(HV), "K": int(K), "V": int(V)}
    if family == "mamba2":
        NH, P, N = shape.temporal
        conv_dim = int(shape.conv[0][0])
        G, rem = divmod(conv_dim - NH * P, 2 * N)
        if rem != 0 or G < 1:
            raise ValueError(f"cannot derive Mamba-2 groups from conv_dim={conv_dim}, NH={NH}, P={P}, N={N}")
        return {"NH": int(NH), "P": int(P), "G": int(G), "N": int(N)}
    raise ValueError(f"unknown ReplaySSM family {family!r}")


def ring_bytes_per_slot(family: str, cache_params, ring_len: int, act_dtype: torch.dtype, num_layers: int) -> int:
    """Ring bytes of one slot over `num_layers` SSM layers (cursors not included), as `_alloc_rings`
    allocates them now (GDN: the raw-key ring only in the plain replay form)."""
    d = ring_dims(family, cache_params)
    if family == "gdn":
        from replayssm_kernels.gdn.rings import gdn_ring_bytes_per_slot

        return gdn_ring_bytes_per_slot(d["H"], d["HV"], d["K"], d["V"], ring_len, act_dtype, num_layers)
    from replayssm_kernels.mamba2.rings import mamba2_ring_bytes_per_slot

    return mamba2_ring_bytes_per_slot(d["NH"], d["P"], d["G"], d["N"], ring_len, act_dtype, num_layers)


def _alloc_rings(family: str, dims: dict, num_layers: int, num_slots: int, ring_len: int, act_dtype, device):
    if family == "gdn":
        from replayssm_kernels.gdn.rings import alloc_gdn_rings

        return alloc_gdn_rings(
            num_layers, num_slots, dims["H"], dims["HV"], dims["K"], dims["V"], ring_len, act_dtype, device
        )
    from replayssm_kernels.mamba2.rings import alloc_mamba2_rings

    return alloc_mamba2_rings(
        num_layers, num_slots, dims["NH"], dims["P"], dims["G"], dims["N"], ring_len, act_dtype, device
    )


def _rings_from_fields(family: str, values: dict):
    if family == "gdn":
        from replayssm_kernels.gdn.rings import GDNRings

        return GDNRings(**values)
    from replayssm_kernels.mamba2.rings import Mamba2Rings

    return Mamba2Rings(**values)


def _gdn_ckpt_split_config(head_k_dim: int) -> bool:
    from replayssm_kernels.configs import gdn_ckpt_split, gdn_ckpt_split_for

    split = gdn_ckpt_split_for(head_k_dim)  # raises when asked for explicitly where it cannot run
    if gdn_ckpt_split() and not split:
        logger.info("sglang-replayssm: GDN checkpoints stay fp32 on this server: the split layout needs the tree "
                    "or shuffle form of the exact replay (head_k_dim 128), here head_k_dim=%d.", head_k_dim)
    return split


def _gdn_fold(state, rings, slot_idx, row_nfold, row_origin, dst=None, dst_idx=None, snap_at=None, snap_slot=None,
              cursors=None, split_ckpt=False):
    from replayssm_kernels.gdn.fold import gdn_replay_fold

    gdn_replay_fold(state, rings, slot_idx, row_nfold, row_origin, dst=dst, dst_idx=dst_idx,
                    snap_at=snap_at, snap_slot=snap_slot, cursors=cursors, split_ckpt=split_ckpt)


# ------------------------------------------------------------------------------ the pool


@dataclass(frozen=True, kw_only=True)
class _RingFields:
    rssm_d: Optional[torch.Tensor] = None
    rssm_k: Optional[torch.Tensor] = None
    rssm_g: Optional[torch.Tensor] = None
    rssm_rawv: Optional[torch.Tensor] = None
    rssm_rawk: Optional[torch.Tensor] = None
    rssm_beta: Optional[torch.Tensor] = None
    rssm_x: Optional[torch.Tensor] = None
    rssm_B: Optional[torch.Tensor] = None
    rssm_dt: Optional[torch.Tensor] = None


class ReplaySSMCpuCopy(NamedTuple):
    """What `get_cpu_copy` returns: SGLang's (conv, temporal) plus rings and cursors."""

    conv: list
    temporal: torch.Tensor
    rings: dict  # State field name -> [Lm, n, ...] CPU tensor
    wpos: torch.Tensor
    origin: torch.Tensor
    ckpt_split: bool = False  # the pool's checkpoint layout when copied (pool.replayssm_ckpt_split)


FoldFn = Callable[..., None]


class ReplaySSMMambaPool(MambaPool):
    """Mamba pool with ReplaySSM rings and cursors (see the module docstring)."""

    @dataclass(frozen=True, kw_only=True)
    class State(MambaPool.State, _RingFields):
        pass

    @dataclass(frozen=True, kw_only=True)
    class SpeculativeState(MambaPool.SpeculativeState, _RingFields):
        pass

    _NON_TRANSFER_STATE_FIELDS = MambaPool._NON_TRANSFER_STATE_FIELDS | RING_FIELD_NAMES

    def __init__(
        self,
        *,
        size: int,
        spec_state_size: int,
        cache_params,
        mamba_layer_ids,
        device: str,
        enable_memory_saver: bool = False,
        speculative_num_draft_tokens: Optional[int] = None,
        speculative_eagle_topk: Optional[int] = None,
        enable_linear_replayssm: bool = False,
        linear_replayssm_cache_len: int = 16,
        envelope_layout: bool = False,
        enable_linear_replayssm_spec: bool = False,
    ):
        ctx = _BUILD.get()
        if ctx is None:
            raise RuntimeError(
                "ReplaySSMMambaPool built outside KVCacheConfigurator._build_hybrid_req_pool "
                "(no ReplaySSM build context: family, ring length, activation dtype). This pool "
                "path is not supported with --mamba-backend replayssm."
            )
        if enable_linear_replayssm or enable_linear_replayssm_spec:
            raise RuntimeError(
                "ReplaySSMMambaPool: SGLang's --enable-linear-replayssm[-spec] must be off with "
                "--mamba-backend replayssm."
            )
        if envelope_layout:
            raise RuntimeError("ReplaySSMMambaPool: --enable-page-major-kv-layout is not supported.")
        if cache_params.dtype.temporal != torch.float32:
            raise RuntimeError(
                f"ReplaySSMMambaPool: the SSM state must be float32 (exact fold), got "
                f"{cache_params.dtype.temporal}; use --mamba-ssm-dtype float32."
            )
        if ctx.ring_len < 0 or (ctx.ring_len == 0 and (ctx.family != "gdn" or speculative_num_draft_tokens is not None)):
            # 0 = no rings: only for a GDN server without speculative decoding whose ring decode can
            # never engage (memory.plan_rings decides; every decode runs SGLang's kernel then).
            raise RuntimeError(f"ReplaySSMMambaPool: ring length must be >= 1, got {ctx.ring_len}")
        if speculative_num_draft_tokens is not None and ctx.ring_len < speculative_num_draft_tokens:
            raise RuntimeError(
                f"ReplaySSMMambaPool: ring length {ctx.ring_len} < {speculative_num_draft_tokens} "
                "draft tokens; pass --replayssm-ring-len >= --speculative-num-draft-tokens."
            )

        # conv + temporal exactly as SGLang allocates them; no speculative buffers (added below
        # without intermediate_ssm).
        super().__init__(
            size=size,
            spec_state_size=spec_state_size,
            cache_params=cache_params,
            mamba_layer_ids=mamba_layer_ids,
            device=device,
            enable_memory_saver=enable_memory_saver,
            speculative_num_draft_tokens=None,
            speculative_eagle_topk=speculative_eagle_topk,
            enable_linear_replayssm=False,
            linear_replayssm_cache_len=linear_replayssm_cache_len,
            envelope_layout=False,
            enable_linear_replayssm_spec=False,
        )
        self.replayssm_family = ctx.family
        self.replayssm_ring_len = int(ctx.ring_len)
        self.replayssm_act_dtype = ctx.act_dtype
        self.replayssm_dims = ring_dims(ctx.family, cache_params)
        self.replayssm_max_draft_tokens = speculative_num_draft_tokens
        num_layers = len(self.mamba_layer_ids)
        num_slots = size + 1
        conv = self.mamba_cache.conv
        temporal = self.mamba_cache.temporal

        with self._alloc_region():
            rings = _alloc_rings(
                ctx.family, self.replayssm_dims, num_layers, num_slots, self.replayssm_ring_len, ctx.act_dtype, device
            )
            self.replayssm_wpos = torch.zeros((num_slots,), dtype=torch.int32, device=device)
            self.replayssm_origin = torch.zeros((num_slots,), dtype=torch.int32, device=device)
            # Ticket counters of the one-launch GDN commit (replayssm_kernels.gdn.gdn_commit); always 0
            # between launches.
            self.replayssm_tickets = torch.zeros((num_slots,), dtype=torch.int32, device=device)
            windows = None
            if speculative_num_draft_tokens is not None:
                windows = self._alloc_conv_windows(
                    cache_params, num_layers, spec_state_size, speculative_num_draft_tokens,
                    speculative_eagle_topk, device,
                )

        ring_fields = {RING_FIELDS[ctx.family][f]: t for f, t in zip(_ring_names(rings), rings.tensors())}
        if windows is not None:
            self.mamba_cache = self.SpeculativeState(
                conv=conv, temporal=temporal, intermediate_ssm=None, intermediate_conv_window=windows,
                **ring_fields,
            )
        else:
            self.mamba_cache = self.State(conv=conv, temporal=temporal, **ring_fields)
        self.replayssm_rings = rings
        self.replayssm_layer_rings = [rings.layer(i) for i in range(num_layers)]
        # GDN checkpoint layout (replayssm_kernels/gdn/ckpt.py). `enabled`: this pool uses the split
        # layout while its decode runs the ring (configs.gdn_ckpt_split at allocation); `split`: the
        # layout every checkpoint of the pool is in now. It is fp32 while SGLang's own decode
        # kernel runs (batches below the ring's threshold; the switch converts every slot), split
        # otherwise, except inside SGLang's prefill/extend calls, which see the batch's slots in
        # fp32 (backends/gdn.py converts them around each layer's call).
        self.replayssm_ckpt_split_enabled = bool(ctx.family == "gdn" and self.replayssm_ring_len > 0
                                                 and _gdn_ckpt_split_config(self.replayssm_dims["K"]))
        self.replayssm_ckpt_split = False
        self.replayssm_fold_fn: Optional[FoldFn] = self._gdn_fold_now if ctx.family == "gdn" else None
        # Mamba-2: the `(A, dt_bias)` pair the fold reads (set_replayssm_mamba2_params).
        self.replayssm_mamba2_params: Optional[tuple] = None

        usage = self.mamba_cache.mem_usage_bytes() + self.replayssm_wpos.numel() * CURSOR_BYTES_PER_SLOT
        if windows is not None:
            usage += _nbytes(self._intermediate_conv_window_phys) - _nbytes(windows)
        self.mem_usage = usage / _GIB
        self._log_sizes(num_slots, num_layers)
        self._warm_ckpt_kernels()

    def _warm_ckpt_kernels(self) -> None:
        """Compile, at creation, the kernels a split pool first needs in the middle of serving:
        the layout conversions (the whole pool; one layer's slots around an extend) and the exact
        fold of `materialize` in both layouts. Measured on an H100 (2026-12-05, docs/serving.md
        session 35): without this the first ring decode and the first extends after it stalled the
        server ~2.5 s (first-use compiles). Every call is an identity: conversions there and back,
        a fold of nothing."""
        temporal = self.mamba_cache.temporal
        if not self.replayssm_ckpt_split_enabled or not _compiles_kernels(temporal) or len(self.mamba_layer_ids) == 0:
            return
        from replayssm_kernels.gdn.ckpt import split_ckpt_convert

        slot0 = torch.zeros(1, dtype=torch.int32, device=temporal.device)
        every = torch.arange(temporal.shape[1], dtype=torch.int32, device=temporal.device)
        for split in (True, False):
            split_ckpt_convert(temporal, None, split)
            split_ckpt_convert(temporal[0], slot0, split)
            # A new pool's rings are empty (cursors 0): these folds replay nothing. One row and
            # every slot: the fold's tile depends on the row count (configs.gdn_fold_block_v).
            for rows in (slot0, every):
                _gdn_fold(temporal, self.replayssm_rings, rows, None, None,
                          cursors=(self.replayssm_wpos, self.replayssm_origin), split_ckpt=split)

    # -- allocation helpers ----------------------------------------------------------------------
    def _alloc_region(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE))
        if self.enable_custom_mem_pool:
            stack.enter_context(torch.cuda.use_mem_pool(self.custom_mem_pool))
        return stack

    def _alloc_conv_windows(self, cache_params, num_layers, spec_state_size, draft_tokens, topk, device):
        """Per-draft conv windows for conv rollback after verify (SGLang's layouts: the
        deduplicated sliding window on CUDA linear chains, dense otherwise)."""
        on_cuda = torch.device(device).type == "cuda"
        conv_shapes = cache_params.shape.conv
        dedup = (
            on_cuda
            and not cache_params.shape.disable_conv_window_dedup
            and conv_window_dedup_enabled(False, not on_cuda, topk, cache_params.is_kda)
        )
        if dedup:
            self.conv_window_axis = self._detect_conv_window_axis(conv_shapes, cache_params.shape.conv_kernel - 1)
            phys, views = [], []
            for conv_shape in conv_shapes:
                p, v = self._allocate_deduplicated_conv_window(
                    conv_shape=conv_shape,
                    num_mamba_layers=num_layers,
                    spec_state_size=spec_state_size,
                    speculative_num_draft_tokens=draft_tokens,
                    conv_dtype=cache_params.dtype.conv,
                )
                phys.append(p)
                views.append(v)
            self._intermediate_conv_window_phys = phys
            return views
        dense = [
            torch.zeros(
                (num_layers, spec_state_size + 1, draft_tokens, *conv_shape),
                dtype=cache_params.dtype.conv,
                device=device,
            )
            for conv_shape in conv_shapes
        ]
        self._intermediate_conv_window_phys = dense
        return dense

    def _log_sizes(self, num_slots: int, num_layers: int) -> None:
        ckpt = _nbytes(self.mamba_cache.temporal) // max(num_slots, 1)
        ring = self.replayssm_rings.nbytes() // max(num_slots, 1)
        spec = ""
        if isinstance(self.mamba_cache, MambaPool.SpeculativeState):
            spec = (
                f"; speculative: no per-draft state snapshots (the rings replace them), conv windows "
                f"{_nbytes(self._intermediate_conv_window_phys) / _GIB:.3f} GiB"
            )
        logger.info(
            "ReplaySSM pool (%s, %d SSM layers, ring_len=%d, rings in %s): per slot checkpoint "
            "%.2f MiB + rings %.2f MiB + cursors %d B; %d slots: checkpoints %.3f GiB, rings %.3f GiB%s",
            self.replayssm_family, num_layers, self.replayssm_ring_len,
            str(self.replayssm_act_dtype).replace("torch.", ""), ckpt / _MIB, ring / _MIB,
            CURSOR_BYTES_PER_SLOT, num_slots, ckpt * num_slots / _GIB, ring * num_slots / _GIB, spec,
        )
        if self.replayssm_ckpt_split_enabled:
            logger.info("ReplaySSM pool: GDN checkpoints in the split layout while the ring kernels run (fp32 as "
                        "hi/lo 16-bit planes, same bytes; bf16 output reads take the hi plane, the exact fold "
                        "both; REPLAYSSM_CONFIG gdn_ckpt_split=0 keeps fp32)")
        if self.replayssm_family == "gdn" and not self.replayssm_rings.has_raw_keys:
            from replayssm_kernels.configs import gdn_k_tree

            logger.info("ReplaySSM pool: no raw-key ring (the exact replay reads the normalised keys in "
                        "its form, REPLAYSSM_CONFIG gdn_k_tree=%d)", gdn_k_tree(self.replayssm_dims["K"]))

    # -- public API for the backends ---------------------------------------------------------------
    @property
    def replayssm_ring_bytes_per_slot(self) -> int:
        return self.replayssm_rings.nbytes() // (self.size + 1)

    @property
    def replayssm_checkpoint_bytes_per_slot(self) -> int:
        return _nbytes(self.mamba_cache.temporal) // (self.size + 1)

    def replayssm_commit(self, slots: torch.Tensor, num_accepted: torch.Tensor, max_draft_tokens: int) -> None:
        """Speculative commit without a radix track: move the rows' cursors by `num_accepted` and
        fold what the early-flush rule says, all layers. GDN with its own fold: `gdn_commit` (one
        launch at small batches); otherwise `commit_prepare` and the registered fold."""
        from replayssm_kernels import commit_prepare

        temporal, rings = self.mamba_cache.temporal, self.replayssm_rings
        if self.replayssm_family == "gdn" and self.replayssm_fold_fn == self._gdn_fold_now:
            from replayssm_kernels.gdn.fold import gdn_commit

            gdn_commit(temporal, rings, slots, self.replayssm_wpos, self.replayssm_origin, num_accepted,
                       max_draft_tokens, self.replayssm_tickets, split_ckpt=self.replayssm_ckpt_split)
            return
        n_fold, origin = commit_prepare(slots, self.replayssm_wpos, self.replayssm_origin, num_accepted,
                                        self.replayssm_ring_len, max_draft_tokens)
        self.replayssm_fold_fn(temporal, rings, slots, n_fold, origin)

    def _gdn_fold_now(self, *args, **kwargs) -> None:
        """The GDN exact fold on the pool's checkpoints in their present layout."""
        _gdn_fold(*args, split_ckpt=self.replayssm_ckpt_split, **kwargs)

    def replayssm_set_ckpt_layout(self, split: bool, slots: Optional[torch.Tensor] = None) -> None:
        """Convert checkpoints (every slot, or `slots` of each layer) to the split layout or back
        to fp32, in place. Without `slots` this is the pool's layout switch (`replayssm_ckpt_split`
        follows); with `slots` only those slots change (the caller keeps track)."""
        if not self.replayssm_ckpt_split_enabled:
            if split:
                raise RuntimeError("this pool does not use the split checkpoint layout")
            return
        from replayssm_kernels.gdn.ckpt import split_ckpt_convert

        if slots is None:
            if split == self.replayssm_ckpt_split:
                return
            split_ckpt_convert(self.mamba_cache.temporal, None, split)
            self.replayssm_ckpt_split = split
        else:
            split_ckpt_convert(self.mamba_cache.temporal, slots, split)

    def set_replayssm_fold(self, fn: FoldFn) -> None:
        """Register the exact fold used by `copy_from`:
        `fn(state, rings, slot_idx, row_nfold, row_origin, dst=, dst_idx=, snap_at=, snap_slot=, cursors=)` with the
        signature of
        `replayssm_kernels.gdn.gdn_replay_fold` over all layers (`state` = temporal
        `[Lm, S, ...]`, `rings` = `replayssm_rings`). GDN has a default; the Mamba-2 backend must
        register one (its fold needs the layers' `A` and `dt_bias`; see
        `set_replayssm_mamba2_params`)."""
        self.replayssm_fold_fn = fn

    def set_replayssm_mamba2_params(self, A: torch.Tensor, dt_bias: torch.Tensor) -> None:
        """Mamba-2: register the layers' fp32 `A` and `dt_bias`, `[Lm, NH]` in pool layer order
        (`mamba_map`), so `copy_from` can fold with `replayssm_kernels.mamba2.mamba2_replay_fold`."""
        if self.replayssm_family != "mamba2":
            raise RuntimeError("set_replayssm_mamba2_params is for Mamba-2 pools")
        Lm, NH = len(self.mamba_layer_ids), self.replayssm_dims["NH"]
        for name, t in (("A", A), ("dt_bias", dt_bias)):
            if tuple(t.shape) != (Lm, NH) or t.dtype != torch.float32 or t.stride(-1) != 1:
                raise ValueError(f"{name} must be fp32 [{Lm}, {NH}] with unit head stride, got {tuple(t.shape)} {t.dtype}")

        def fold(state, rings, slot_idx, row_nfold, row_origin, dst=None, dst_idx=None, snap_at=None,
                 snap_slot=None, cursors=None):
            from replayssm_kernels.mamba2.fold import mamba2_replay_fold

            mamba2_replay_fold(state, rings, A, dt_bias, slot_idx, row_nfold, row_origin, dst=dst, dst_idx=dst_idx,
                               snap_at=snap_at, snap_slot=snap_slot, cursors=cursors)

        self.replayssm_mamba2_params = (A, dt_bias)
        self.replayssm_fold_fn = fold

    def replayssm_reset_cursors(self, indices) -> None:
        """Empty the rings of these slots (`< 0` entries skipped). Runs on every slot allocation,
        so on the GPU it is one kernel launch on the index tensor as given (no conversions)."""
        idx = self._as_index(indices)
        if idx.numel() == 0:
            return
        if self.replayssm_wpos.is_cuda or _triton_interpret():
            from replayssm_kernels import reset_cursors

            reset_cursors(idx, self.replayssm_wpos, self.replayssm_origin)
            return
        idx = idx[idx >= 0]
        self.replayssm_wpos[idx] = 0
        self.replayssm_origin[idx] = 0

    def _as_index(self, indices) -> torch.Tensor:
        """1-D integer index tensor on the pool's device; a no-op for SGLang's slot tensors."""
        if isinstance(indices, torch.Tensor) and indices.device == self.replayssm_wpos.device:
            idx = indices.reshape(-1)
            if idx.dtype in (torch.int32, torch.int64) and idx.is_contiguous():
                return idx
            return idx.to(torch.int64).contiguous()
        idx = torch.as_tensor(indices, device=self.replayssm_wpos.device)
        return idx.reshape(-1).to(torch.int64).contiguous()

    # -- SGLang slot operations ----------------------------------------------------------------------
    def clear_slots(self, indices: torch.Tensor):
        super().clear_slots(indices)
        self.replayssm_reset_cursors(indices)

    def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor):
        """Copy-on-write: dst gets src's conv state and src's *committed* recurrent state
        (checkpoint with the pending ring entries folded in, exactly), with an empty ring."""
        super().copy_from(src_indices, dst_indices)
        src = self._as_index(src_indices).to(torch.int32).contiguous()
        dst = self._as_index(dst_indices).to(torch.int32).contiguous()
        if src.numel() > 0 and len(self.mamba_layer_ids) > 0 and self.replayssm_ring_len > 0:
            if self.replayssm_fold_fn is None:
                raise RuntimeError(
                    f"ReplaySSMMambaPool({self.replayssm_family}).copy_from: no exact fold registered; "
                    "the Mamba-2 backend must call mamba_pool.set_replayssm_mamba2_params(A, dt_bias) "
                    "(or set_replayssm_fold) at init."
                )
            temporal = self.mamba_cache.temporal
            self.replayssm_fold_fn(temporal, self.replayssm_rings, src, None, None, dst=temporal, dst_idx=dst,
                                   cursors=(self.replayssm_wpos, self.replayssm_origin))
        self.replayssm_reset_cursors(dst)

    def get_cpu_copy(self, indices):
        conv_cpu, temporal_cpu = super().get_cpu_copy(indices)
        idx = self._as_index(indices)
        rings = {
            name: getattr(self.mamba_cache, name)[:, idx].to("cpu")
            for name in RING_FIELDS[self.replayssm_family].values()
        }
        return ReplaySSMCpuCopy(
            conv=conv_cpu,
            temporal=temporal_cpu,
            rings=rings,
            wpos=self.replayssm_wpos[idx].to("cpu"),
            origin=self.replayssm_origin[idx].to("cpu"),
            ckpt_split=self.replayssm_ckpt_split,
        )

    def load_cpu_copy(self, mamba_cache_cpu, indices):
        if not isinstance(mamba_cache_cpu, ReplaySSMCpuCopy):
            raise RuntimeError(
                "ReplaySSMMambaPool.load_cpu_copy: the CPU copy has no ReplaySSM rings/cursors "
                f"(got {type(mamba_cache_cpu).__name__}); restoring it would drop pending ring entries."
            )
        super().load_cpu_copy((mamba_cache_cpu.conv, mamba_cache_cpu.temporal), indices)
        idx = self._as_index(indices)
        for name, t in mamba_cache_cpu.rings.items():
            dst = getattr(self.mamba_cache, name)
            dst[:, idx] = t.to(dst.device)
        self.replayssm_wpos[idx] = mamba_cache_cpu.wpos.to(self.replayssm_wpos.device)
        self.replayssm_origin[idx] = mamba_cache_cpu.origin.to(self.replayssm_origin.device)
        if mamba_cache_cpu.ckpt_split != self.replayssm_ckpt_split:
            # Saved in the other checkpoint layout (the pool switched since): convert these slots.
            self.replayssm_set_ckpt_layout(self.replayssm_ckpt_split, idx.to(torch.int32))


def _compiles_kernels(t: torch.Tensor) -> bool:
    """Whether kernels on `t` are compiled (a GPU), so that warming them up pays (the seam
    tests/test_ckpt_split_integration.py patches to run the warm-up under the interpreter)."""
    return t.is_cuda


def _triton_interpret() -> bool:
    """`configs.interpreted()`, imported when asked (the seam tests/test_pool.py patches)."""
    from replayssm_kernels.configs import interpreted

    return interpreted()


def _ring_names(rings) -> list[str]:
    from dataclasses import fields

    return [f.name for f in fields(rings)]


def _nbytes(t) -> int:
    if t is None:
        return 0
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return int(t.numel()) * t.element_size()


# ------------------------------------------------------------------------------ runtime hooks


def around_alloc(original, self, reqs, *args, **kwargs):
    """AROUND `HybridReqToTokenPool.alloc(reqs)`: reset the cursors of newly assigned slots."""
    pool = getattr(self, "mamba_pool", None)
    if not isinstance(pool, ReplaySSMMambaPool):
        return original(self, reqs, *args, **kwargs)
    fresh = [r for r in reqs if getattr(r, "mamba_pool_idx", None) is None]
    out = original(self, reqs, *args, **kwargs)
    if out is not None and fresh:
        pool.replayssm_reset_cursors(torch.stack([torch.as_tensor(r.mamba_pool_idx).reshape(()) for r in fresh]))
    return out


def after_init_mamba_pool(_result, self, *args, **kwargs):
    """AFTER `HybridReqToTokenPool._init_mamba_pool`: hand the slot allocator its ReplaySSM pool,
    so `around_slot_alloc` can empty the rings of every slot it gives out."""
    pool = getattr(self, "mamba_pool", None)
    if isinstance(pool, ReplaySSMMambaPool):
        self.mamba_allocator._replayssm_pool = pool


def around_slot_alloc(original, self, need_size, *args, **kwargs):
    """AROUND `MambaSlotAllocator._do_alloc(need_size)`: the slots taken off the free list start
    with empty rings.

    A freed slot keeps the cursors of its last life (a finished request's working slot usually
    has pending entries). Only `HybridReqToTokenPool.alloc` resets the working slot; the ping-pong
    track slots (`_alloc_ping_pong_buffer`, the lazy extra_buffer slots) and the radix cache's
    own slots come straight from the allocator. A track slot holds a full checkpoint written by
    the track copy, and `cache_finished_req` (extra_buffer) inserts it into the tree as is: with
    stale cursors, the copy-on-write of a later prefix hit would fold stale ring entries into
    the new request's state. Runs on the scheduler's stream, like SGLang's own allocation-time
    cursor reset (`HybridReqToTokenPool.alloc`)."""
    out = original(self, need_size, *args, **kwargs)
    pool = getattr(self, "_replayssm_pool", None)
    if pool is not None and out is not None:
        pool.replayssm_reset_cursors(out)
    return out


def around_donate(original, self, req, new_slot, *args, **kwargs):
    """AROUND `HybridReqToTokenPool.donate_mamba_ping_pong_slot(req, new_slot)`: the donated
    track slot (now a radix-cache checkpoint) and the replacement track slot start empty."""
    donated = original(self, req, new_slot, *args, **kwargs)
    pool = getattr(self, "mamba_pool", None)
    if isinstance(pool, ReplaySSMMambaPool):
        pool.replayssm_reset_cursors(donated)
        pool.replayssm_reset_cursors(new_slot)
    return donated
