"""Per-batch ReplaySSM bookkeeping shared by the GDN and Mamba-2 attention backends.

All host work happens here, once per forward batch and outside CUDA-graph capture; the per-layer
kernels only read what this step prepared (docs/design.md):

* decode batch: `decode_prepare` snapshots each row's cursor into per-row buffers (static
  per-batch-size buffers under CUDA graphs, refreshed in place before every replay) and advances
  the slot cursors; rows whose state the radix cache snapshots this step (`mamba_track_mask`) are
  forced to flush, so the checkpoint it copies is current. Under CUDA graphs the mask is the
  graph's own static buffer, recorded at capture: SGLang's replay view (`build_replay_fb_view`)
  carries no `mamba_track_mask`, while the captured track copy reads that buffer, which the
  runner refills before every replay;
* target verify: nothing (the verify kernels read the slot cursors; commit moves them);
* extend / prefill / mixed batches: every row's pending entries are folded into its checkpoint
  (exact fold, all layers) and its ring emptied, so SGLang's chunked kernels start from the
  committed state. Rows without pending entries cost nothing.

No `.item()`, no host sync, no data-dependent allocation on any of these paths.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from replayssm_kernels import decode_prepare, decode_row_order, reset_cursors
from replayssm_kernels.configs import gdn_flush_phase, gdn_flush_spread, ring_min_batch

logger = logging.getLogger("sglang_replayssm")

# Diagnostics for device runs: REPLAYSSM_DIAG_FLUSH=N logs every N-th ring decode batch's rows
# (how many flush, how the pending counts spread over the ring): whether served rows are staggered
# over the ring as the kernel benchmark's staggered rows are. Costs a host sync on those batches.
DIAG_FLUSH_ENV = "REPLAYSSM_DIAG_FLUSH"


def _diag_flush_every() -> int:
    raw = os.environ.get(DIAG_FLUSH_ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise ValueError(f"{DIAG_FLUSH_ENV} must be a whole number of decode batches (0 = off), got {raw!r}; "
                         f"fix or unset {DIAG_FLUSH_ENV}")
    return int(raw)


def replayssm_pool_of(model_runner, family: str):
    """The ReplaySSM pool of this runner if it serves `family`, else None (stock path).

    A speculative draft runner (NEXTN/MTP) shares the target's request pool, and SGLang gives it a
    hybrid backend with a linear child too (its `full_attn_layers = [0]`: the MTP head is all
    softmax attention). That child must never touch the shared cursors: its draft decode steps
    would otherwise advance the target's ring write positions (at batches >= the ring threshold)
    and fold every slot. So a draft runner gets None here; `refuse_draft_linear_forward` refuses a
    draft model that does run linear layers."""
    pool = runner_replayssm_pool(model_runner)
    if pool is not None and not getattr(model_runner, "is_draft_worker", False):
        if pool.replayssm_family != family:
            raise RuntimeError(
                f"--mamba-backend replayssm: a {family} attention backend was built on a "
                f"{pool.replayssm_family} ReplaySSM pool"
            )
        return pool
    return None


def runner_replayssm_pool(model_runner):
    """The runner's mamba pool if it is a ReplaySSM pool, else None."""
    from sglang_replayssm.pool import ReplaySSMMambaPool

    pool = getattr(getattr(model_runner, "req_to_token_pool", None), "mamba_pool", None)
    return pool if isinstance(pool, ReplaySSMMambaPool) else None


def is_draft_on_replayssm_pool(model_runner) -> bool:
    return runner_replayssm_pool(model_runner) is not None and bool(getattr(model_runner, "is_draft_worker", False))


def refuse_draft_linear_forward(family: str) -> None:
    raise RuntimeError(
        f"--mamba-backend replayssm: the speculative draft model runs {family} layers on the target's "
        "ReplaySSM pool, which is not supported (the NEXTN/MTP heads of Qwen3-Next/Qwen3.5 and "
        "Nemotron-H are attention-only). Use a draft model without linear/SSM layers, or drop "
        "--mamba-backend replayssm."
    )


class ReplaySSMBatchState:
    """Row snapshots of the current batch and the static buffers that back them in graphs."""

    def __init__(self, pool, device):
        self.pool = pool
        self.device = device
        self.ring_len = pool.replayssm_ring_len
        # Below configs.ring_min_batch decode rows do not use the ring: a GDN batch runs SGLang's
        # own decode kernel on the (emptied) checkpoints, faster than any ring plan measured there;
        # a Mamba-2 batch runs the exact recurrence every step.
        self.ring_min_batch = ring_min_batch(pool.replayssm_family)
        self.stock_decode_below = pool.replayssm_family == "gdn"
        # A GDN pool without rings (memory.plan_rings: the ring decode could never engage on this
        # server): every decode batch runs the parent's kernel, nothing is ever pending.
        self.rings_off = self.ring_len == 0
        if self.rings_off:
            self.ring_min_batch = 1 << 30
        # This batch's decode runs the parent backend's kernel (set per batch by `prepare`).
        self.decode_stock = False
        # Some ring may hold pending entries (any ring decode or verify since the last full fold).
        self._rings_dirty = not self.rings_off
        self._all_slots: Optional[torch.Tensor] = None
        self.row_wp: Optional[torch.Tensor] = None
        self.row_flush: Optional[torch.Tensor] = None
        # GDN decode: the order in which the state launch takes the rows (configs.gdn_flush_spread,
        # -1 = batch order, no buffer); set per batch with row_wp / row_flush.
        self.flush_spread = gdn_flush_spread() if pool.replayssm_family == "gdn" else -1
        # GDN decode: rows also flush on their slot's phase (configs.gdn_flush_phase), counted in
        # ring decode batches.
        self.flush_phase = pool.replayssm_family == "gdn" and gdn_flush_phase()
        self._decode_steps = 0
        self.row_order: Optional[torch.Tensor] = None
        # With the row order, the flush index of the same launch (cursors.decode_row_order), read
        # by decode plans with a flush capacity (configs.GDNDecodeConfig.flush_cap).
        self.flush_index: Optional[torch.Tensor] = None
        self._static_findex: Optional[torch.Tensor] = None
        self._static_wp: Optional[torch.Tensor] = None
        self._static_flush: Optional[torch.Tensor] = None
        self._static_order: Optional[torch.Tensor] = None
        self._diag_every = _diag_flush_every()
        self._diag_batches = 0
        # decode graph batch size -> the captured batch's `mamba_track_mask` (a static buffer
        # slice, or None when radix tracking is off)
        self._graph_track_mask: dict = {}
        self._exact_rows: dict = {}
        logged = getattr(pool, "_replayssm_backend_logged", False)
        if not logged:
            pool._replayssm_backend_logged = True
            if self.rings_off:
                logger.info("sglang-replayssm: no rings on this GDN server (see the 'no rings allocated' line): "
                            "every decode batch runs SGLang's own decode kernel, prefill/extend its chunked "
                            "kernels.")
            else:
                logger.info(
                    "sglang-replayssm: %s layers run ReplaySSM (ring_len=%d): decode and target verify "
                    "on the ring kernels, prefill/extend on SGLang's chunked kernels.",
                    pool.replayssm_family, self.ring_len,
                )
            if self.rings_off or not self.stock_decode_below:
                pass  # said above (no rings) / Mamba-2: one dispatch at every batch size
            elif self.ring_min_batch <= 1:
                logger.info("sglang-replayssm: GDN decode batches of every size run the ring decode "
                            "(gdn_ring_min_batch=%d).", self.ring_min_batch)
            else:
                logger.info(
                    "sglang-replayssm: GDN decode batches below %d rows run SGLang's own decode kernel on "
                    "folded checkpoints (the ring decode was slower there on the H200, docs/perf.md); "
                    "from %d rows the ring decode. Change with REPLAYSSM_CONFIG=gdn_ring_min_batch=N.",
                    self.ring_min_batch, self.ring_min_batch,
                )
            if self.flush_phase and not self.rings_off:
                logger.info("sglang-replayssm: GDN ring decode rows also flush on their slot's phase, so that "
                            "requests which start together do not all flush on one step (exact either way; "
                            "REPLAYSSM_CONFIG=gdn_flush_phase=0 flushes only full rings).")
            if self.flush_spread >= 0 and not self.rings_off:
                logger.info("sglang-replayssm: GDN ring decode launches take their flush rows early, spread over "
                            "the first %d%% of each launch (scheduling only; REPLAYSSM_CONFIG=gdn_flush_spread=-1 "
                            "keeps the batch order).", self.flush_spread)

    def init_graph_buffers(self, max_bs: int) -> None:
        self._static_wp = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self._static_flush = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        if self.flush_spread >= 0:
            self._static_order = torch.arange(max_bs, dtype=torch.int32, device=self.device)
            self._static_findex = torch.full((2 * max_bs,), -1, dtype=torch.int32, device=self.device)

    def exact_rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Snapshots that make `n` rows run the exact (flush) path on an empty ring: used for the
        decode rows of mixed prefill+decode batches, whose rings were just folded."""
        if n not in self._exact_rows:
            self._exact_rows[n] = (
                torch.zeros(n, dtype=torch.int32, device=self.device),
                torch.ones(n, dtype=torch.int32, device=self.device),
            )
        return self._exact_rows[n]

    def prepare(self, forward_batch, slots: torch.Tensor, graph: bool, in_capture: bool) -> None:
        mode = forward_batch.forward_mode
        self.decode_stock = False
        if mode.is_decode_or_idle():
            bs = slots.shape[0]
            if self.stock_decode_below and bs < self.ring_min_batch:
                # SGLang's kernel reads the checkpoint as the whole state: fold every pending entry
                # of every slot first (once per switch from the ring; rows with empty rings cost
                # nothing), eagerly, before the graph replay or the eager forward.
                self.decode_stock = True
                if self._rings_dirty and not in_capture:
                    self.materialize(self._every_slot())
                    self._rings_dirty = False
                if not in_capture:
                    # SGLang's kernel reads and writes fp32 checkpoints (no-op unless split).
                    self.pool.replayssm_set_ckpt_layout(False)
                self.row_wp = self.row_flush = self.row_order = self.flush_index = None
                return
            if not in_capture:
                self._rings_dirty = True
                self._ring_layout()
            if graph:
                if self._static_wp is None or self._static_wp.shape[0] < bs:
                    raise RuntimeError("ReplaySSM: CUDA-graph buffers not initialised for this batch size")
                row_wp, row_flush = self._static_wp[:bs], self._static_flush[:bs]
                row_order = self._static_order[:bs] if self.flush_spread >= 0 else None
                findex = self._static_findex[:2 * bs] if self.flush_spread >= 0 else None
            else:
                row_wp = torch.empty(bs, dtype=torch.int32, device=self.device)
                row_flush = torch.empty(bs, dtype=torch.int32, device=self.device)
                row_order = torch.empty(bs, dtype=torch.int32, device=self.device) if self.flush_spread >= 0 else None
                findex = torch.empty(2 * bs, dtype=torch.int32, device=self.device) if self.flush_spread >= 0 else None
            if in_capture:
                # Capture runs on dummy rows: never touch the real cursors. The captured batch's
                # track mask is the static buffer the captured track copy reads at every replay.
                self._graph_track_mask[bs] = getattr(forward_batch, "mamba_track_mask", None)
                row_wp.zero_()
                row_flush.zero_()
                if row_order is not None:
                    torch.arange(bs, out=row_order)
                    findex.fill_(-1)
            else:
                if graph:
                    if bs not in self._graph_track_mask:
                        raise RuntimeError(f"ReplaySSM: no decode CUDA graph was captured for batch size {bs}")
                    force = self._graph_track_mask[bs]
                else:
                    force = getattr(forward_batch, "mamba_track_mask", None)
                if bs < self.ring_min_batch:
                    force = self.exact_rows(bs)[1]
                elif force is not None:
                    # Any int or bool mask: decode_prepare reads it as is (no conversion launch per step).
                    force = force[:bs]
                    if force.shape[0] < bs:
                        force = torch.cat([force, force.new_zeros(bs - force.shape[0])])
                    force = force.contiguous()
                decode_prepare(
                    slots.contiguous(), self.pool.replayssm_wpos, self.ring_len, force_flush=force,
                    row_wp=row_wp, row_flush=row_flush,
                    phase_step=self._decode_steps if self.flush_phase else None,
                )
                self._decode_steps += 1
                if row_order is not None:
                    decode_row_order(row_flush, self.flush_spread, row_order=row_order, flush_index=findex)
                if self._diag_every:
                    self._diag_batches += 1
                    if self._diag_batches % self._diag_every == 0:
                        self._log_rows(slots, row_wp, row_flush)
            self.row_wp, self.row_flush, self.row_order, self.flush_index = row_wp, row_flush, row_order, findex
        elif mode.is_target_verify():
            if not in_capture:
                self._rings_dirty = True
                self._ring_layout()
            self.row_wp = self.row_flush = self.row_order = self.flush_index = None
        elif mode.is_extend(include_draft_extend_v2=True) and not mode.is_draft_extend_v2():
            if not in_capture:
                self.materialize(slots)
            self.row_wp = self.row_flush = self.row_order = self.flush_index = None

    def _ring_layout(self) -> None:
        """The ring kernels run on split checkpoints where the pool uses them: switch the whole
        pool back after SGLang's own decode kernel ran (once per switch; a no-op otherwise)."""
        if self.pool.replayssm_ckpt_split_enabled and not self.pool.replayssm_ckpt_split:
            self.pool.replayssm_set_ckpt_layout(True)

    @property
    def split_ckpt(self) -> bool:
        """The checkpoint layout the ring kernels read: the pool's ring layout, a constant of the
        pool. Not the layout of the moment: CUDA graphs are captured before any ring batch has
        converted the pool, and every ring batch converts it (`_ring_layout`) before it runs."""
        return self.pool.replayssm_ckpt_split_enabled

    def _log_rows(self, slots: torch.Tensor, row_wp: torch.Tensor, row_flush: torch.Tensor) -> None:
        valid = slots[: row_wp.shape[0]] >= 0
        hist = torch.bincount(row_wp[valid].long().cpu(), minlength=self.ring_len).tolist()
        logger.info("ReplaySSM diag decode batch %d: rows=%d flush=%d pending-count histogram %s",
                    self._diag_batches, int(valid.sum()), int((row_flush[valid] != 0).sum()), hist)

    def _every_slot(self) -> torch.Tensor:
        if self._all_slots is None:
            n = self.pool.replayssm_wpos.shape[0]
            self._all_slots = torch.arange(n, dtype=torch.int32, device=self.pool.replayssm_wpos.device)
        return self._all_slots

    def materialize(self, slots: torch.Tensor) -> None:
        """Fold every pending entry of these slots into their checkpoints and empty the rings."""
        pool = self.pool
        if slots.numel() == 0 or self.rings_off:
            return
        slots = slots.contiguous()
        if pool.replayssm_fold_fn is None:
            raise RuntimeError("ReplaySSM: no exact fold registered on the pool")
        # Two launches: the fold reads each slot's cursors itself, then the rings are emptied.
        pool.replayssm_fold_fn(pool.mamba_cache.temporal, pool.replayssm_rings, slots, None, None,
                               cursors=(pool.replayssm_wpos, pool.replayssm_origin))
        reset_cursors(slots, pool.replayssm_wpos, pool.replayssm_origin)


class ReplaySSMMetadataMixin:
    """Per-batch ReplaySSM preparation for an SGLang `MambaAttnBackendBase` subclass.

    Put it first in the bases; the subclass sets `self._rssm` (a `ReplaySSMBatchState`, or None
    when the pool is not a ReplaySSM pool: then these are the parent's methods unchanged)."""

    _rssm: Optional[ReplaySSMBatchState] = None

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        if self._rssm is not None:
            self._rssm.prepare(forward_batch, self.forward_metadata.mamba_cache_indices, graph=False, in_capture=False)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        if self._rssm is not None:
            self._rssm.prepare(forward_batch, self.forward_metadata.mamba_cache_indices, graph=True,
                               in_capture=in_capture)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        if self._rssm is not None:
            self._rssm.init_graph_buffers(max_bs)
