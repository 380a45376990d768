"""Per-slot ring cursors, shared by the GDN and Mamba-2 kernels and by all SSM layers.

Each slot owns two int32 cursors: ``wpos`` (number of pending ring entries) and ``origin``
(physical ring index of logical entry 0). Logical entry ``j`` lives at ``(origin + j) % L``.

Both launches below run once per batch, outside CUDA-graph capture, before (decode) or after
(speculative commit) the layers; the per-layer kernels only read the per-row snapshots they write.

Glossary: ``B`` rows, ``S`` slots, ``L`` ring length, ``T_max`` max draft tokens.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

_BLOCK_ROWS = 128


@triton.jit(do_not_specialize=["phase_step"])
def _decode_prepare_kernel(
    slot_idx,
    wpos,
    force_flush,
    row_wp,
    row_flush,
    B,
    phase_step,
    RL: tl.constexpr,
    HAS_FORCE: tl.constexpr,
    BLOCK: tl.constexpr,
    PHASE: tl.constexpr = False,
):
    o_r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_r = o_r < B
    b_slot = tl.load(slot_idx + o_r, mask=m_r, other=-1).to(tl.int64)
    m_valid = m_r & (b_slot >= 0)
    b_wp = tl.load(wpos + b_slot, mask=m_valid, other=0)
    b_flush = b_wp + 1 >= RL
    if PHASE:
        # Each slot also flushes on the steps of its own phase (slot mod L), so rows that started
        # together (one prefill batch) fall into L flush groups after their first cycle.
        b_flush = b_flush | ((phase_step + b_slot) % RL == 0)
    if HAS_FORCE:
        b_force = tl.load(force_flush + o_r, mask=m_valid, other=0)
        b_flush = b_flush | (b_force != 0)
    tl.store(row_wp + o_r, b_wp, mask=m_r)
    tl.store(row_flush + o_r, (b_flush & m_valid).to(tl.int32), mask=m_r)
    tl.store(wpos + b_slot, tl.where(b_flush, 0, b_wp + 1), mask=m_valid)


def decode_prepare(
    slot_idx: torch.Tensor,
    wpos: torch.Tensor,
    ring_len: int,
    force_flush: Optional[torch.Tensor] = None,
    row_wp: Optional[torch.Tensor] = None,
    row_flush: Optional[torch.Tensor] = None,
    phase_step: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Snapshot the decode cursors of a batch and advance them by one token.

    Args:
        slot_idx (torch.Tensor): `[B]` int32/int64 slot of each row; `< 0` marks padding.
        wpos (torch.Tensor): `[S]` int32 per-slot pending-entry count. Mutated in place.
        ring_len (int): `L`.
        force_flush (torch.Tensor, optional): `[B]` int/bool; nonzero forces a flush on this step.
        row_wp, row_flush (torch.Tensor, optional): `[B]` int32 outputs (allocated if None).
        phase_step (int, optional): a counter of decode steps; when given, a row also flushes
            when `(phase_step + slot) % L == 0`, so that rows which started decoding on the same
            step flush on different steps from their second cycle on. A flush is the exact
            replay whenever it runs, so this changes no result, only when the work is done.

    Returns:
        `(row_wp, row_flush)`: the pending count before this token and whether this step flushes.
        A flushing slot's `wpos` becomes 0, any other slot's `wpos` grows by one.
    """
    B = slot_idx.shape[0]
    assert wpos.dtype == torch.int32 and wpos.is_contiguous()
    assert slot_idx.is_contiguous()
    if row_wp is None:
        row_wp = torch.empty(B, dtype=torch.int32, device=slot_idx.device)
    if row_flush is None:
        row_flush = torch.empty(B, dtype=torch.int32, device=slot_idx.device)
    if force_flush is not None:
        assert force_flush.shape == (B,) and force_flush.is_contiguous()
        if force_flush.dtype == torch.bool:
            force_flush = force_flush.view(torch.uint8)  # read as bytes: no conversion launch
    if B == 0:
        return row_wp, row_flush
    grid = (triton.cdiv(B, _BLOCK_ROWS),)
    _decode_prepare_kernel[grid](
        slot_idx,
        wpos,
        force_flush if force_flush is not None else row_flush,
        row_wp,
        row_flush,
        B,
        0 if phase_step is None else int(phase_step) % ring_len,
        RL=ring_len,
        HAS_FORCE=force_flush is not None,
        BLOCK=_BLOCK_ROWS,
        PHASE=phase_step is not None,
    )
    return row_wp, row_flush


@triton.jit
def _commit_prepare_kernel(
    slot_idx,
    wpos,
    origin,
    num_accepted,
    fold_window,
    row_nfold,
    row_origin,
    track_steps,
    track_slots,
    snap_at,
    snap_slot,
    seq_lens,
    chain_last,
    chain_steps,
    track_interval,
    B,
    RL: tl.constexpr,
    T_MAX: tl.constexpr,
    HAS_FOLD_WINDOW: tl.constexpr,
    HAS_TRACK: tl.constexpr,
    CHAIN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    o_r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_r = o_r < B
    b_slot = tl.load(slot_idx + o_r, mask=m_r, other=-1).to(tl.int64)
    m_valid = m_r & (b_slot >= 0)
    b_wp = tl.load(wpos + b_slot, mask=m_valid, other=0)
    b_org = tl.load(origin + b_slot, mask=m_valid, other=0)
    b_acc = tl.load(num_accepted + o_r, mask=m_valid, other=0).to(tl.int32)
    b_n = b_wp + b_acc
    b_nfold = early_flush(b_n, RL, T_MAX)
    if HAS_FOLD_WINDOW:
        # Caller-requested fold through the first `fold_window` entries of this window
        # (e.g. the radix track boundary): at least wp + fold_window entries.
        b_fw = tl.load(fold_window + o_r, mask=m_valid, other=0).to(tl.int32)
        b_nfold = tl.where(b_fw > 0, tl.maximum(b_nfold, tl.minimum(b_wp + b_fw, b_n)), b_nfold)
    if HAS_TRACK:
        # Radix track boundary after window step `track_steps` (< 0: none): fold at least through
        # it, and have the fold store the state there (entry wp + step + 1) into `track_slots`.
        if CHAIN:
            # A linear draft chain accepts window steps 0 .. acc - 1, so SGLang's step indices
            # (`_verify_commit_step_indices`) reduce to: the last accepted step acc - 1, and the
            # step that reaches the next multiple of the track interval when this commit crosses
            # one (-1 otherwise). Every row gets both, padding included, as SGLang computes them.
            b_acc_all = tl.load(num_accepted + o_r, mask=m_r, other=1).to(tl.int64)
            b_pre = tl.load(seq_lens + o_r, mask=m_r, other=0).to(tl.int64)
            b_post = b_pre + b_acc_all
            b_point = (b_post // track_interval) * track_interval
            b_cross = (b_pre // track_interval) != (b_post // track_interval)
            b_st = tl.where(b_cross, tl.maximum(b_point - b_pre - 1, 0), -1).to(tl.int32)
            tl.store(chain_last + o_r, (b_acc_all - 1).to(tl.int32), mask=m_r)
            tl.store(chain_steps + o_r, b_st, mask=m_r)
            b_st = tl.where(m_valid, b_st, -1)
        else:
            b_st = tl.load(track_steps + o_r, mask=m_valid, other=-1).to(tl.int32)
        b_tr = m_valid & (b_st >= 0)
        b_fw = tl.where(b_tr, b_st + 1, 0)
        b_nfold = tl.where(b_fw > 0, tl.maximum(b_nfold, tl.minimum(b_wp + b_fw, b_n)), b_nfold)
        b_ts = tl.load(track_slots + o_r, mask=b_tr, other=-1).to(tl.int32)
        tl.store(snap_at + o_r, tl.where(b_tr, b_wp + b_st + 1, -1), mask=m_r)
        tl.store(snap_slot + o_r, tl.where(b_tr, b_ts, -1), mask=m_r)
    b_nfold = tl.where(m_valid, b_nfold, 0)
    tl.store(row_nfold + o_r, b_nfold, mask=m_r)
    tl.store(row_origin + o_r, b_org, mask=m_r)
    tl.store(wpos + b_slot, b_n - b_nfold, mask=m_valid)
    tl.store(origin + b_slot, (b_org + b_nfold) % RL, mask=m_valid)


@triton.jit
def early_flush(b_n, RL: tl.constexpr, T_MAX: tl.constexpr):
    """Entries to fold of a row with `b_n` committed entries: all of them when the next window
    (up to T_MAX entries) might not fit into the ring, else none."""
    return tl.where(b_n + T_MAX > RL, b_n, 0)


@triton.jit
def commit_in_fold(wpos, origin, num_accepted, tickets, i_n, slot, n_programs, RL: tl.constexpr,
                   T_MAX: tl.constexpr):
    """`commit_prepare`'s cursor move (no fold window, no radix track) inside the fold launch:
    `(entries to fold, origin)` of row `i_n` / slot `slot`, from the cursors before the commit.

    Each of the row's `n_programs` programs reads the old cursors and then takes a ticket from
    `tickets[slot]` (an atomic add, acquire-release, after a barrier so that every thread's read
    is done); the program that draws the last ticket has seen every other program's reads happen
    before, so it alone stores the moved cursors and puts the counter back to 0 for the next
    launch."""
    b_wp = tl.load(wpos + slot)
    b_org = tl.load(origin + slot)
    b_n = b_wp + tl.load(num_accepted + i_n).to(tl.int32)
    b_nfold = early_flush(b_n, RL, T_MAX)
    tl.debug_barrier()
    ticket = tl.atomic_add(tickets + slot, 1, sem="acq_rel")
    if ticket == n_programs - 1:
        tl.store(wpos + slot, b_n - b_nfold)
        tl.store(origin + slot, (b_org + b_nfold) % RL)
        tl.store(tickets + slot, 0)
    return b_nfold, b_org


def _launch_commit(slot_idx, wpos, origin, num_accepted, ring_len, max_draft_tokens, row_nfold, row_origin,
                   fold_window=None, track=None, chain=None) -> None:
    """The one commit launch behind `commit_prepare`, `commit_prepare_tracked` and
    `commit_prepare_chain_tracked`. `track`: None or `(track_steps, track_slots, snap_at,
    snap_slot)`; `chain`: None or `(seq_lens, track_interval, last_step, track_steps)` (then
    `track`'s `track_steps` is the output `chain` names)."""
    assert wpos.dtype == torch.int32 and origin.dtype == torch.int32
    if ring_len < max_draft_tokens:
        raise ValueError(
            f"ring_len={ring_len} is smaller than max_draft_tokens={max_draft_tokens}"
        )
    B = slot_idx.shape[0]
    if B == 0:
        return
    steps, tslots, snap_at, snap_slot = track if track is not None else (num_accepted, num_accepted, row_nfold,
                                                                          row_origin)
    seq_lens, interval, last, csteps = chain if chain is not None else (num_accepted, 1, row_nfold, row_origin)
    _commit_prepare_kernel[(triton.cdiv(B, _BLOCK_ROWS),)](
        slot_idx,
        wpos,
        origin,
        num_accepted,
        fold_window if fold_window is not None else num_accepted,
        row_nfold,
        row_origin,
        steps,
        tslots,
        snap_at,
        snap_slot,
        seq_lens,
        last,
        csteps,
        interval,
        B,
        RL=ring_len,
        T_MAX=max_draft_tokens,
        HAS_FOLD_WINDOW=fold_window is not None,
        HAS_TRACK=track is not None,
        CHAIN=chain is not None,
        BLOCK=_BLOCK_ROWS,
    )


def commit_prepare(
    slot_idx: torch.Tensor,
    wpos: torch.Tensor,
    origin: torch.Tensor,
    num_accepted: torch.Tensor,
    ring_len: int,
    max_draft_tokens: int,
    fold_window: Optional[torch.Tensor] = None,
    row_nfold: Optional[torch.Tensor] = None,
    row_origin: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Commit `num_accepted` verified entries per row and decide which entries to fold.

    Args:
        slot_idx (torch.Tensor): `[B]` slot of each row; `< 0` marks padding.
        wpos, origin (torch.Tensor): `[S]` int32 cursors. Mutated in place.
        num_accepted (torch.Tensor): `[B]` int, accepted drafts of each row (bonus token included).
        ring_len (int): `L`.
        max_draft_tokens (int): `T_max`; rows with `wpos + T_max > L` after the commit are folded
            completely (early flush), so the next window always fits.
        fold_window (torch.Tensor, optional): `[B]` int; when > 0, fold at least through the first
            `fold_window` entries of this verify window (`wpos + fold_window` entries in all).
        row_nfold, row_origin (torch.Tensor, optional): `[B]` int32 outputs.

    Returns:
        `(row_nfold, row_origin)`: entries to fold per row and the origin they start from. The fold
        kernel must run with these before the next verify.
    """
    B = slot_idx.shape[0]
    if row_nfold is None:
        row_nfold = torch.empty(B, dtype=torch.int32, device=slot_idx.device)
    if row_origin is None:
        row_origin = torch.empty(B, dtype=torch.int32, device=slot_idx.device)
    _launch_commit(slot_idx, wpos, origin, num_accepted, ring_len, max_draft_tokens, row_nfold, row_origin,
                   fold_window=fold_window)
    return row_nfold, row_origin


def commit_prepare_tracked(
    slot_idx: torch.Tensor,
    wpos: torch.Tensor,
    origin: torch.Tensor,
    num_accepted: torch.Tensor,
    ring_len: int,
    max_draft_tokens: int,
    track_steps: torch.Tensor,
    track_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`commit_prepare` plus the radix-cache track snapshot plan, in one launch.

    Args:
        track_steps (torch.Tensor): `[B]` int, window step whose state the radix cache keeps
            (`< 0`: none this step); the row folds at least through it.
        track_slots (torch.Tensor): `[B]` int, the slot that state goes to.
        (the others as in `commit_prepare`; slot and count tensors may be int32 or int64)

    Returns:
        `(row_nfold, row_origin, snap_at, snap_slot)`, `[B]` int32 each: the fold plan and, per
        row, after how many folded entries to store the state into which slot (`-1`: none), for
        the fold's `snap_at` / `snap_slot`. Same cursor moves as `commit_prepare` with
        `fold_window = track_steps + 1` on the tracked rows.
    """
    out = torch.empty((4, slot_idx.shape[0]), dtype=torch.int32, device=slot_idx.device)
    row_nfold, row_origin, snap_at, snap_slot = out.unbind(0)
    _launch_commit(slot_idx, wpos, origin, num_accepted, ring_len, max_draft_tokens, row_nfold, row_origin,
                   track=(track_steps, track_slots, snap_at, snap_slot))
    return row_nfold, row_origin, snap_at, snap_slot


def commit_prepare_chain_tracked(
    slot_idx: torch.Tensor,
    wpos: torch.Tensor,
    origin: torch.Tensor,
    num_accepted: torch.Tensor,
    ring_len: int,
    max_draft_tokens: int,
    seq_lens: torch.Tensor,
    track_interval: int,
    track_slots: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """`commit_prepare_tracked` for a linear draft chain (topk 1), with SGLang's step indices
    computed in the same launch instead of by `_verify_commit_step_indices` on the host.

    Args:
        seq_lens (torch.Tensor): `[B]` int, each row's length before this verify (`batch.seq_lens`).
        track_interval (int): the radix cache's track interval (`mamba_track_interval`).
        track_slots (torch.Tensor): `[B]` int, the slot the crossing state goes to.
        (the others as in `commit_prepare`)

    Returns:
        `(row_nfold, row_origin, snap_at, snap_slot, last_step, track_steps)`, `[B]` int32 each: the
        fold plan and snapshot plan of `commit_prepare_tracked`, then SGLang's
        `(last_correct_step_indices, mamba_steps_to_track)` for a linear chain: `acc - 1`, and the
        window step whose state reaches the next multiple of `track_interval` when the commit
        crosses one (`-1` otherwise).
    """
    if track_interval < 1:
        raise ValueError(f"track_interval must be >= 1, got {track_interval}")
    out = torch.empty((6, slot_idx.shape[0]), dtype=torch.int32, device=slot_idx.device)
    row_nfold, row_origin, snap_at, snap_slot, last_step, track_steps = out.unbind(0)
    _launch_commit(slot_idx, wpos, origin, num_accepted, ring_len, max_draft_tokens, row_nfold, row_origin,
                   track=(track_steps, track_slots, snap_at, snap_slot),
                   chain=(seq_lens, int(track_interval), last_step, track_steps))
    return row_nfold, row_origin, snap_at, snap_slot, last_step, track_steps


@triton.jit
def load_fold_plan(row_nfold, row_origin, i_n, slot, FROM_CURSORS: tl.constexpr):
    """(entries to fold, origin) of row `i_n` / slot `slot` for the fold kernels: from the per-row
    plan (`commit_prepare`, `pending_fold_plan`), or, with FROM_CURSORS, from the per-slot cursors
    themselves (every pending entry)."""
    if FROM_CURSORS:
        n_fold = tl.load(row_nfold + slot)
        org = tl.load(row_origin + slot)
    else:
        n_fold = tl.load(row_nfold + i_n)
        org = tl.load(row_origin + i_n)
    return n_fold, org


def pending_fold_plan(
    slot_idx: torch.Tensor, wpos: torch.Tensor, origin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row `(n_fold, origin)` that folds every pending entry; cursors are not touched.

    Used to materialise the committed state into a separate buffer (harness `state()`,
    CPU offload) without changing the ring.
    """
    valid = slot_idx >= 0
    safe = slot_idx.clamp(min=0).long()
    n = torch.where(valid, wpos[safe], torch.zeros_like(wpos[safe]))
    org = torch.where(valid, origin[safe], torch.zeros_like(origin[safe]))
    return n.to(torch.int32).contiguous(), org.to(torch.int32).contiguous()


@triton.jit
def _decode_row_order_kernel(row_flush, row_order, flush_index, B, SPREAD: tl.constexpr, BLOCK: tl.constexpr,
                             INDEX: tl.constexpr):
    # One program. Flush rank i goes before non-flush rank j iff i * nnf * SPREAD <= j * nf * 100,
    # so the two ranked sequences merge in closed form (each position = own rank + how many of the
    # other kind precede it); the positions are a permutation of 0..B-1.
    o_r = tl.arange(0, BLOCK)
    m_r = o_r < B
    f = (tl.load(row_flush + o_r, mask=m_r, other=0) != 0) & m_r
    fi = f.to(tl.int64)
    ni = (m_r & ~f).to(tl.int64)
    nf = tl.sum(fi, 0)
    nn = tl.sum(ni, 0)
    rank_f = tl.cumsum(fi, 0) - 1
    rank_n = tl.cumsum(ni, 0) - 1
    if SPREAD == 0:
        pos_f = rank_f
        pos_n = rank_n + nf
    else:
        # flush rank i: preceded by the non-flush ranks j with j * nf * 100 < i * nn * SPREAD
        den_f = tl.maximum(nf * 100, 1)
        pos_f = rank_f + (rank_f * nn * SPREAD + den_f - 1) // den_f
        # non-flush rank j: preceded by the flush ranks i < nf with i * nn * SPREAD <= j * nf * 100
        den_n = tl.maximum(nn * SPREAD, 1)
        pos_n = rank_n + tl.minimum(nf, (rank_n * nf * 100) // den_n + 1)
    pos = tl.where(f, pos_f, pos_n)
    tl.store(row_order + pos, o_r.to(tl.int32), mask=m_r)
    if INDEX:
        # [0, B): flush rank -> row (-1 past the flush rows); [B, 2B): row -> flush rank (-1)
        tl.store(flush_index + rank_f, o_r.to(tl.int32), mask=f)
        tl.store(flush_index + nf + rank_n, tl.full([BLOCK], -1, tl.int32), mask=m_r & ~f)
        tl.store(flush_index + B + o_r, tl.where(f, rank_f, -1).to(tl.int32), mask=m_r)


def decode_row_order(row_flush: torch.Tensor, spread: int, row_order: Optional[torch.Tensor] = None,
                     flush_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The order in which a GDN decode launch takes its rows: flush rows (long exact replays) early,
    so that they do not form the launch's tail, and interleaved with the non-flush rows (memory
    reads) so that both kinds share the SMs.

    Args:
        row_flush (torch.Tensor): `[B]` int32 from `decode_prepare`.
        spread (int): 0..100, the share of the order (percent, from the front) over which the flush
            rows are spread evenly; 0 puts them all first, 100 spreads them over the whole batch.
        row_order (torch.Tensor, optional): `[B]` int32 output.
        flush_index (torch.Tensor, optional): `[2B]` int32 output, written in the same launch:
            `[0, B)` the flush rows in batch order (entry i = the row of flush rank i; -1 past the
            last), `[B, 2B)` each row's flush rank (-1 for a non-flush row). Decode plans with a
            flush capacity (`configs.GDNDecodeConfig.flush_cap`) read it.

    Returns:
        `[B]` int32, a permutation of the rows. It changes scheduling only, never a result: every
        program computes the same values whichever order the rows are taken in.
    """
    B = row_flush.shape[0]
    if not 0 <= spread <= 100:
        raise ValueError(f"spread must be 0..100, got {spread}")
    if row_order is None:
        row_order = torch.empty(B, dtype=torch.int32, device=row_flush.device)
    if B == 0:
        return row_order
    if B > _ORDER_MAX_ROWS:
        raise ValueError(f"decode_row_order handles up to {_ORDER_MAX_ROWS} rows in one program, got {B}")
    assert row_flush.is_contiguous() and row_order.is_contiguous() and row_order.dtype == torch.int32
    if flush_index is not None and (flush_index.shape != (2 * B,) or flush_index.dtype != torch.int32
                                    or not flush_index.is_contiguous()):
        raise ValueError(f"flush_index must be a contiguous [2 * B] = [{2 * B}] int32 tensor")
    _decode_row_order_kernel[(1,)](row_flush, row_order, row_order if flush_index is None else flush_index, B,
                                   SPREAD=spread, BLOCK=max(16, triton.next_power_of_2(B)), num_warps=4,
                                   INDEX=flush_index is not None)
    return row_order


def decode_order_and_index(row_flush: torch.Tensor, spread: int
                           ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The row order and flush index of a launch (`decode_row_order`, one call), freshly allocated;
    `(None, None)` at spread -1 (batch order). The backend keeps its own buffers for CUDA graphs."""
    if spread < 0:
        return None, None
    flush_index = torch.empty(2 * row_flush.shape[0], dtype=torch.int32, device=row_flush.device)
    return decode_row_order(row_flush, spread, flush_index=flush_index), flush_index


_ORDER_MAX_ROWS = 16384


@triton.jit
def _reset_cursors_kernel(slot_idx, wpos, origin, B, BLOCK: tl.constexpr):
    o_r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b_slot = tl.load(slot_idx + o_r, mask=o_r < B, other=-1).to(tl.int64)
    m = (o_r < B) & (b_slot >= 0)
    tl.store(wpos + b_slot, tl.zeros([BLOCK], dtype=tl.int32), mask=m)
    tl.store(origin + b_slot, tl.zeros([BLOCK], dtype=tl.int32), mask=m)


def reset_cursors(slot_idx: torch.Tensor, wpos: torch.Tensor, origin: torch.Tensor) -> None:
    """Empty the rings of the given slots (`< 0` entries are skipped); no host sync."""
    B = slot_idx.shape[0]
    if B == 0:
        return
    _reset_cursors_kernel[(triton.cdiv(B, _BLOCK_ROWS),)](slot_idx, wpos, origin, B, BLOCK=_BLOCK_ROWS)
