"""SGLang-facing logic of the ReplaySSM backends (CPU, Triton interpreter), against SGLang 0.5.17.

What is pinned here, each with the SGLang behaviour it depends on:

* CUDA-graph decode replay: SGLang's replay view (`build_replay_fb_view`) has no
  `mamba_track_mask`; the forced flush must follow the static mask buffer the captured track copy
  reads, recorded at capture.
* Mamba-2 decode through the registered `replayssm` SSU with the arguments exactly as
  `MambaMixer2.forward` builds them (stride-0 expansions, strided dt, out view), with a DP-padded
  snapshot (`_original_batch_size`: the mixer passes fewer rows than the batch has): state bit
  for bit equal to SGLang's `selective_state_update`, flush-step outputs too.
* Mamba-2 fold parameters are one pair per pool, shared by every backend instance on it.
* Every slot that leaves `MambaSlotAllocator` starts with empty rings (extra_buffer track slots
  are inserted into the radix tree by `cache_finished_req` without copy-on-write).
* Speculative commit: committed state and radix track snapshot bit for bit equal to SGLang's
  recurrent GDN kernel over the accepted tokens; conv rollback calls identical to stock; the
  early-flush margin uses the pool's largest draft window (adaptive speculation).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool

import sglang_replayssm
from sglang_replayssm import hooks
from sglang_replayssm.backends.common import ReplaySSMBatchState
from sglang_replayssm.pool import PoolBuildContext, ReplaySSMMambaPool, pool_build_context
from replayssm_kernels.configs import override

from pool_helpers import build_pool, gdn_params, mamba2_params

bf16 = torch.bfloat16




def fake_req():
    return SimpleNamespace(
        req_pool_idx=None, mamba_pool_idx=None, mamba_ping_pong_track_buffer=None, mamba_next_track_idx=None,
        mamba_needs_clear=False, inflight_middle_chunks=0, kv_committed_len=0, rid="r",
    )


@pytest.fixture
def cpu_device_ctx(monkeypatch):
    # SGLang's Triton SSU launcher enters torch.get_device_module(dev).device(idx); torch.cpu lacks it.
    monkeypatch.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)


# ------------------------------------------------------------------------------ CUDA-graph decode


def _replay_view(bs, raw_bs, buffers):
    """SGLang's own replay view, as DecodeCudaGraphRunner.load_batch builds it."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens_sum=raw_bs * 9,
                         seq_lens_cpu=torch.full((raw_bs,), 9), out_cache_loc=None, spec_info=None)
    return build_replay_fb_view(forward_batch=fb, buffers=buffers, bs=bs, raw_bs=raw_bs, num_tokens=bs,
                                seq_len_fill_value=1, capture_forward_mode=ForwardMode.DECODE,
                                is_encoder_decoder=False)


def test_graph_replay_forces_flush_on_the_captured_track_mask():
    L, max_bs, bs = 4, 4, 3
    pool = build_pool("gdn", gdn_params(), size=6, ring_len=L)
    st = ReplaySSMBatchState(pool, "cpu")
    st.flush_phase = False  # only the track mask forces flushes here (the phase: its own test)
    st.ring_min_batch = 1  # ring path at any batch size (smaller batches otherwise flush every row)
    st.init_graph_buffers(max_bs)
    # The runner's static buffers: registry mask slot and the backend's state_indices_list[bs - 1].
    mask_buf = torch.zeros(max_bs, dtype=torch.bool)
    slots = torch.zeros(bs, dtype=torch.int32)
    buffers = SimpleNamespace(
        input_ids=torch.zeros(max_bs, dtype=torch.int64), positions=torch.zeros(max_bs, dtype=torch.int64),
        req_pool_indices=torch.zeros(max_bs, dtype=torch.int64), seq_lens=torch.ones(max_bs, dtype=torch.int64),
        seq_lens_cpu=torch.ones(max_bs, dtype=torch.int64), encoder_lens=None,
        mamba_track_indices=torch.zeros(max_bs, dtype=torch.int64), mamba_track_mask=mask_buf,
    )

    # capture: the captured batch carries the registry slot as its mamba_track_mask
    pool.replayssm_wpos.fill_(2)
    capture = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=bs, mamba_track_mask=mask_buf[:bs])
    st.prepare(capture, slots, graph=True, in_capture=True)
    assert pool.replayssm_wpos.tolist() == [2] * 7, "capture must not move the real cursors"
    assert st.row_wp.tolist() == [0, 0, 0] and st.row_flush.tolist() == [0, 0, 0]
    captured = (st.row_wp.data_ptr(), st.row_flush.data_ptr())

    # replay: rows on slots 1 and 4, one padding row; the runner refills the mask buffer first
    slots.copy_(torch.tensor([1, 4, -1], dtype=torch.int32))
    pool.replayssm_wpos.zero_()
    pool.replayssm_wpos[1], pool.replayssm_wpos[4] = 1, 2
    mask_buf[:bs] = torch.tensor([False, True, False])
    view = _replay_view(bs, 2, buffers)
    assert not hasattr(view, "mamba_track_mask"), "SGLang's replay view now carries the mask: revisit this path"
    st.prepare(view, slots, graph=True, in_capture=False)
    assert (st.row_wp.data_ptr(), st.row_flush.data_ptr()) == captured, "snapshots must stay in the captured buffers"
    assert st.row_wp.tolist() == [1, 2, 0]
    assert st.row_flush.tolist() == [0, 1, 0], "the tracked row must flush on this step"
    assert pool.replayssm_wpos.tolist() == [0, 2, 0, 0, 0, 0, 0]

    # eager decode reads the batch's own mask
    slots_e = torch.tensor([1, 4], dtype=torch.int32)
    eager = SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=torch.tensor([True, False]))
    st.prepare(eager, slots_e, graph=False, in_capture=False)
    assert st.row_wp.tolist() == [2, 0] and st.row_flush.tolist() == [1, 0]
    assert pool.replayssm_wpos.tolist() == [0, 0, 0, 0, 1, 0, 0]

    with pytest.raises(RuntimeError, match="no decode CUDA graph was captured for batch size 2"):
        st.prepare(_replay_view(2, 2, buffers), slots_e, graph=True, in_capture=False)


def _recording_fold(calls, with_origin):
    """A fold stand-in that records what it would fold: (slots, n per row[, origin per row], other kwargs).
    A fold told to read the cursors (`cursors=`) folds what `pending_fold_plan` says at call time."""
    from replayssm_kernels import pending_fold_plan

    def fold(state, rings, slots, n, org, cursors=None, **kw):
        if cursors is not None:
            assert n is None and org is None
            n, org = pending_fold_plan(slots, *cursors)
        calls.append((slots.tolist(), n.tolist(), org.tolist(), kw) if with_origin else (slots.tolist(), n.tolist()))

    return fold


def test_extend_batches_materialize_every_row():
    """Extend / mixed batches fold every row's pending entries before any layer runs (SGLang's
    chunked kernels read the checkpoint of every row, decode rows of a MIXED batch included)."""
    pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
    st = ReplaySSMBatchState(pool, "cpu")
    calls = []
    pool.replayssm_fold_fn = _recording_fold(calls, with_origin=True)
    pool.replayssm_wpos[1], pool.replayssm_origin[1] = 3, 2
    pool.replayssm_wpos[3] = 1
    for mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
        st.prepare(SimpleNamespace(forward_mode=mode), torch.tensor([3, 1, -1], dtype=torch.int32),
                   graph=False, in_capture=False)
        assert st.row_wp is None and st.row_flush is None
    assert calls[0] == ([3, 1, -1], [1, 3, 0], [0, 2, 0], {})
    assert calls[1] == ([3, 1, -1], [0, 0, 0], [0, 0, 0], {}), "the first fold must have emptied the rings"
    assert pool.replayssm_wpos.tolist() == [0] * 5 and pool.replayssm_origin.tolist() == [0] * 5
    # target verify and draft-extend-v2 leave the cursors to the commit
    pool.replayssm_wpos[1] = 2
    for mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2):
        st.prepare(SimpleNamespace(forward_mode=mode), torch.tensor([1], dtype=torch.int32), graph=False,
                   in_capture=False)
    assert len(calls) == 2 and int(pool.replayssm_wpos[1]) == 2


def test_small_gdn_decode_batches_run_sglang_kernel_on_folded_checkpoints():
    """Below configs.ring_min_batch("gdn") a decode batch runs the parent's kernel: every pending
    entry of every slot is folded first (once per switch away from the ring), cursors stay put."""
    from replayssm_kernels.configs import ring_min_batch

    assert ring_min_batch("gdn") > 2 and ring_min_batch("mamba2") == 1
    pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
    st = ReplaySSMBatchState(pool, "cpu")
    st.flush_phase = False  # the cursor checks below count appended entries (the phase: its own test)
    calls = []
    pool.replayssm_fold_fn = _recording_fold(calls, with_origin=False)
    pool.replayssm_wpos[2], pool.replayssm_origin[2] = 3, 1
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None)
    slots = torch.tensor([2, 0], dtype=torch.int32)

    st.prepare(decode, slots, graph=False, in_capture=False)
    assert st.decode_stock and st.row_wp is None
    assert calls == [(list(range(5)), [0, 0, 3, 0, 0])], "every slot's pending entries are folded first"
    assert pool.replayssm_wpos.tolist() == [0] * 5 and pool.replayssm_origin.tolist() == [0] * 5
    st.prepare(decode, slots, graph=False, in_capture=False)
    assert len(calls) == 1, "no fold while every ring stays empty"

    # a verify (or a ring decode) may leave entries behind: the next small decode folds again
    st.prepare(SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY), slots, graph=False, in_capture=False)
    assert not st.decode_stock
    st.prepare(decode, slots, graph=False, in_capture=False)
    assert len(calls) == 2 and st.decode_stock
    # capture never touches the real rings
    st.prepare(SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY), slots, graph=False, in_capture=False)
    st.init_graph_buffers(4)
    st.prepare(decode, slots, graph=True, in_capture=True)
    assert len(calls) == 2 and st.decode_stock

    # at and above the threshold the ring path runs (decode_prepare advances the cursors)
    st.ring_min_batch = 2
    st.prepare(decode, slots, graph=False, in_capture=False)
    assert not st.decode_stock and st.row_wp is not None
    assert pool.replayssm_wpos[2] == 1 and pool.replayssm_wpos[0] == 1

    # Mamba-2 keeps its own kernels at every batch size (exact recurrence below the threshold)
    m2 = ReplaySSMBatchState(build_pool("mamba2", mamba2_params(4, 16, 2, 16, layers=(0,)), size=4, ring_len=4),
                             "cpu")
    m2.ring_min_batch = 8
    m2.prepare(decode, slots, graph=False, in_capture=False)
    assert not m2.decode_stock and m2.row_flush.tolist() == [1, 1]


def test_gdn_ring_decode_batches_carry_a_flush_early_row_order():
    """A GDN ring decode batch gets the state launch's row order (configs.gdn_flush_spread) beside
    its cursor snapshots: the flush rows first at spread 0, in the captured static buffer under
    CUDA graphs (the identity while capturing), none for stock-mode decode, Mamba-2 or spread -1; the
    flush index of the same launch beside it (flush rows in batch order, each row's flush rank), in
    its own captured buffer (no flush row while capturing)."""
    from replayssm_kernels.configs import gdn_flush_spread, override

    assert gdn_flush_spread() == 75
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None)
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    with override("gdn_ring_min_batch", (1,)), override("gdn_flush_spread", (0,)):
        pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
        st = ReplaySSMBatchState(pool, "cpu")
        pool.replayssm_wpos[0] = 3  # row 1 flushes this step
        st.prepare(decode, slots, graph=False, in_capture=False)
        assert st.row_flush.tolist() == [0, 1, 0] and st.row_order.tolist() == [1, 0, 2]
        assert st.flush_index.tolist() == [1, -1, -1, -1, 0, -1]
        st.init_graph_buffers(4)
        st.prepare(decode, slots, graph=True, in_capture=True)
        captured, captured_index = st.row_order.data_ptr(), st.flush_index.data_ptr()
        assert st.row_order.tolist() == [0, 1, 2] and st.flush_index.tolist() == [-1] * 6
        pool.replayssm_wpos[3] = 3  # row 2 flushes
        st._graph_track_mask[3] = None
        st.prepare(decode, slots, graph=True, in_capture=False)
        assert st.row_order.data_ptr() == captured, "the order must stay in the captured buffer"
        assert st.flush_index.data_ptr() == captured_index, "the flush index must stay in its captured buffer"
        assert st.row_flush.tolist() == [0, 0, 1] and st.row_order.tolist() == [2, 0, 1]
        assert st.flush_index.tolist() == [2, -1, -1, -1, -1, 0]
        st.prepare(SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY), slots, graph=False, in_capture=False)
        assert st.row_order is None and st.flush_index is None
    with override("gdn_ring_min_batch", (1,)), override("gdn_flush_spread", (-1,)):
        st = ReplaySSMBatchState(build_pool("gdn", gdn_params(), size=4, ring_len=4), "cpu")
        st.prepare(decode, slots, graph=False, in_capture=False)
        assert st.row_wp is not None and st.row_order is None and st.flush_index is None
    m2 = ReplaySSMBatchState(build_pool("mamba2", mamba2_params(4, 16, 2, 16, layers=(0,)), size=4, ring_len=4),
                             "cpu")
    m2.prepare(decode, slots, graph=False, in_capture=False)
    assert m2.row_flush is not None and m2.row_order is None and m2.flush_index is None


def test_diag_flush_logs_every_nth_ring_decode_batch(monkeypatch, caplog):
    """REPLAYSSM_DIAG_FLUSH=N: every N-th ring decode batch logs its rows, flush rows and the
    histogram of pending counts (padding rows left out); a bad value names the variable."""
    import logging

    from replayssm_kernels.configs import override

    monkeypatch.setenv("REPLAYSSM_DIAG_FLUSH", "2")
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None)
    with override("gdn_ring_min_batch", (1,)):
        pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
        st = ReplaySSMBatchState(pool, "cpu")
        st.flush_phase = False
        pool.replayssm_wpos[:4] = torch.tensor([3, 1, 0, 1], dtype=torch.int32)
        slots = torch.tensor([0, 1, -1, 3], dtype=torch.int32)
        with caplog.at_level(logging.INFO, logger="sglang_replayssm"):
            st.prepare(decode, slots, graph=False, in_capture=False)
            assert "diag decode batch" not in caplog.text
            st.prepare(decode, slots, graph=False, in_capture=False)
        # second batch: slot 0 flushed in the first (wpos 0), slots 1 and 3 at 2
        assert "diag decode batch 2: rows=3 flush=0 pending-count histogram [1, 0, 2, 0]" in caplog.text
    monkeypatch.setenv("REPLAYSSM_DIAG_FLUSH", "x")
    with pytest.raises(ValueError, match="REPLAYSSM_DIAG_FLUSH"):
        ReplaySSMBatchState(build_pool("gdn", gdn_params(), size=4, ring_len=4), "cpu")


def test_gdn_decode_rows_flush_on_their_slot_phase():
    """configs.gdn_flush_phase: rows that start decoding together (every ring empty) flush on
    different steps: from the second cycle on, each slot flushes every L ring decode batches at
    its own phase, a 1/L share of the rows per batch; the full-ring rule still holds (no row ever
    holds L entries). Mamba-2 pools and gdn_flush_phase=0 flush only full rings."""
    from replayssm_kernels.configs import override

    L, n = 4, 8
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None)
    slots = torch.arange(n, dtype=torch.int32)
    with override("gdn_ring_min_batch", (1,)):
        pool = build_pool("gdn", gdn_params(), size=n, ring_len=L)
        st = ReplaySSMBatchState(pool, "cpu")
        assert st.flush_phase
        flushes = []
        for step in range(3 * L):
            st.prepare(decode, slots, graph=False, in_capture=False)
            assert int(st.row_wp.max()) <= L - 1
            flushes.append(st.row_flush.nonzero().flatten().tolist())
        for step, rows in enumerate(flushes):
            assert rows == [r for r in range(n) if (step + r) % L == 0], step
        with override("gdn_flush_phase", (0,)):
            st0 = ReplaySSMBatchState(build_pool("gdn", gdn_params(), size=n, ring_len=L), "cpu")
            for step in range(L):
                st0.prepare(decode, slots, graph=False, in_capture=False)
                assert st0.row_flush.tolist() == [int(step == L - 1)] * n
    m2 = ReplaySSMBatchState(build_pool("mamba2", mamba2_params(4, 16, 2, 16, layers=(0,)), size=n, ring_len=L),
                             "cpu")
    assert not m2.flush_phase


def test_gdn_backend_hands_stock_mode_decode_to_sglang(monkeypatch):
    """A decode batch `prepare` marked `decode_stock` goes to SGLang's own forward_decode, untouched;
    a ring-mode batch does not."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_replayssm.backends import gdn as gdn_mod

    def stub_init(self, model_runner):  # SGLang's constructor needs a model config; keep what we read
        self.device = "cpu"
        self.req_to_token_pool = model_runner.req_to_token_pool

    calls = []
    monkeypatch.setattr(GDNAttnBackend, "__init__", stub_init)
    monkeypatch.setattr(GDNAttnBackend, "forward_decode",
                        lambda self, layer, fb, mixed_qkv, a, b, **kw: calls.append((layer, mixed_qkv)) or "stock")
    pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
    backend = gdn_mod.ReplaySSMGDNAttnBackend(SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=pool)))
    backend._rssm.decode_stock = True
    assert backend.forward_decode("layer", None, "qkv", None, None) == "stock" and calls == [("layer", "qkv")]
    backend._rssm.decode_stock = False

    def ring_path(*a, **k):
        raise AssertionError("ring path reached")

    monkeypatch.setattr(backend, "_layer", ring_path)
    with pytest.raises(AssertionError, match="ring path reached"):
        backend.forward_decode(SimpleNamespace(layer_id=0), None, "qkv", None, None)
    assert len(calls) == 1


def test_draft_runner_backend_never_touches_the_shared_cursors(monkeypatch):
    """SGLang builds a hybrid backend with a GDN child for the NEXTN draft runner too (sharing the
    target's request pool); its draft decode batches must leave the target's ring cursors alone
    (on the H200 a draft decode at >= 256 rows advanced them before this was pinned). The target's
    backend on the same pool does advance them, which shows the check can fail."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_replayssm.backends import gdn as gdn_mod

    def stub_init(self, model_runner):
        self.device = "cpu"
        self.req_to_token_pool = model_runner.req_to_token_pool

    def stub_metadata(self, forward_batch):
        self.forward_metadata = SimpleNamespace(mamba_cache_indices=forward_batch.slots)

    monkeypatch.setattr(GDNAttnBackend, "__init__", stub_init)
    monkeypatch.setattr(GDNAttnBackend, "init_forward_metadata", stub_metadata)
    stack = contextlib.ExitStack()
    stack.enter_context(override("gdn_ring_min_batch", (1,)))  # ring decode at this small batch
    stack.enter_context(override("gdn_flush_phase", (0,)))  # cursors count appended entries only
    pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, slots=slots, mamba_track_mask=None)

    def runner(draft):
        return SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=pool), is_draft_worker=draft)

    draft = gdn_mod.ReplaySSMGDNAttnBackend(runner(True))
    assert draft._rssm is None
    for _ in range(3):
        draft.init_forward_metadata(batch)
    assert pool.replayssm_wpos.tolist() == [0, 0, 0, 0, 0]
    with pytest.raises(RuntimeError, match="draft model runs GDN layers"):
        draft.forward_decode(SimpleNamespace(layer_id=0), batch, None, None, None)

    with stack:
        target = gdn_mod.ReplaySSMGDNAttnBackend(runner(False))
        target.init_forward_metadata(batch)
    assert pool.replayssm_wpos[:3].tolist() == [1, 1, 1]


# ------------------------------------------------------------------------------ Mamba-2 SSU


def _mixer_decode_args(x2d, dt_proj, Bc, C2d, A, D, dt_bias, NH, P, G, N):
    """The decode-path tensors exactly as MambaMixer2.forward (mamba.py L686-L747) builds them."""
    A_d = A[:, None, ...][:, :, None].expand(-1, P, N).to(dtype=torch.float32)
    dt_d = dt_proj[:, :, None].expand(-1, -1, P)
    dt_bias_d = dt_bias[:, None, ...].expand(-1, P)
    D_d = D[:, None, ...].expand(-1, P)
    B_d = Bc.view(-1, G, Bc.shape[1] // G)
    C_d = C2d.view(-1, G, C2d.shape[1] // G)
    x_d = x2d.view(-1, NH, P)
    return x_d, dt_d, A_d, B_d, C_d, D_d, dt_bias_d


def test_mamba2_decode_through_the_ssu_registry_with_dp_padding(cpu_device_ctx, monkeypatch):
    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    from sglang_replayssm.backends import mamba2 as m2
    from sglang_replayssm.ssu import ReplaySSMSSUBackend

    gen = torch.Generator().manual_seed(5)
    NH, P, G, N, L = 4, 16, 2, 16, 4
    pool = build_pool("mamba2", mamba2_params(NH, P, G, N, layers=(0,)), size=6, ring_len=L)
    A = -(torch.rand(NH, generator=gen) * 7.5 + 0.5)  # post-load: -exp(A_log), fp32 parameter
    D = torch.randn(NH, generator=gen).to(bf16)  # model-dtype parameters
    dt_bias = torch.log(torch.expm1(torch.rand(NH, generator=gen) * 0.29 + 0.01)).to(bf16)
    pool.set_replayssm_mamba2_params(A[None].clone(), dt_bias.float()[None].clone())
    temporal = pool.mamba_cache.temporal
    temporal[0] = torch.randn(temporal[0].shape, generator=gen) * 0.1
    ref = temporal[0].clone()
    untouched = [0, 2, 4, 5, 6]
    before = temporal[0, untouched].clone()

    st = ReplaySSMBatchState(pool, "cpu")
    ctx = m2.Mamba2LayerContext(st, pool.replayssm_layer_rings[0], A.clone(), D.float(), dt_bias.float(), "decode")
    monkeypatch.setattr(m2, "_CURRENT", ctx)
    ssu = ReplaySSMSSUBackend()
    # DP attention: 3 batch rows (one padded, slot -1), the mixer's SSU covers the 2 real rows.
    slots = torch.tensor([3, 1, -1], dtype=torch.int32)
    idx = slots[:2]
    conv_dim = NH * P + 2 * G * N
    for step in range(6):
        track = torch.tensor([step == 2, False, False])  # row 0 snapshotted by the radix cache at step 2
        st.prepare(SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=track), slots,
                   graph=False, in_capture=False)
        flushed = st.row_flush[:2].bool()
        proj = (torch.randn(2, 24 + NH, generator=gen) * 0.5).to(bf16)  # [.. | dt]: dt strided like in_proj output
        xbc = torch.randn(2, conv_dim, generator=gen).to(bf16)
        x2d, Bc, C2d = torch.split(xbc, [NH * P, G * N, G * N], dim=-1)
        args = _mixer_decode_args(x2d, proj[:, 24:], Bc, C2d, A, D, dt_bias, NH, P, G, N)
        x_d, dt_d, A_d, B_d, C_d, D_d, dtb_d = args
        out = torch.empty(2, NH * P, dtype=bf16)
        ssu(temporal[0], x_d, dt_d, A_d, B_d, C_d, D_d, z=None, dt_bias=dtb_d, dt_softplus=True,
            state_batch_indices=idx, out=out.view(2, -1, P))
        out_ref = torch.empty(2, NH * P, dtype=bf16)
        selective_state_update(ref, x_d, dt_d, A_d, B_d, C_d, D_d, z=None, dt_bias=dtb_d, dt_softplus=True,
                               state_batch_indices=idx, out=out_ref.view(2, -1, P))
        assert torch.equal(out[flushed], out_ref[flushed]), f"flush-step output not bit-exact at step {step}"
        assert (out.float() - out_ref.float()).abs().max() < 5e-2
        if step == 2:
            assert bool(flushed[0]), "the tracked row must flush"
            assert torch.equal(temporal[0, 3], ref[3]), "checkpoint of the tracked row must be current"
    # committed state = checkpoint + pending entries, folded exactly (copy-on-write into spare slots)
    assert pool.replayssm_wpos[[3, 1]].tolist() == [3, 2]  # row 0 flushed at step 2, row 1 at step 3 (L=4)
    pool.copy_from(torch.tensor([3, 1]), torch.tensor([5, 6]))
    assert torch.equal(temporal[0, 5], ref[3]) and torch.equal(temporal[0, 6], ref[1])
    assert torch.equal(temporal[0, [0, 2, 4]], before[:3]), "padding / other slots must stay untouched"

    with pytest.raises(RuntimeError, match="decode snapshot for 3 rows, SSU called with 4"):
        ctx.decode_rows(4)


def test_mamba2_fold_params_are_shared_by_every_backend_on_the_pool(monkeypatch):
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

    from sglang_replayssm.backends.mamba2 import ReplaySSMMamba2AttnBackend

    def stub_init(self, model_runner):  # SGLang's constructor needs a model config; keep what we read
        self.device = "cpu"
        self.req_to_token_pool = model_runner.req_to_token_pool

    monkeypatch.setattr(Mamba2AttnBackend, "__init__", stub_init)
    NH = 4
    pool = build_pool("mamba2", mamba2_params(NH, 16, 2, 16, layers=(1, 3)), size=4, ring_len=4)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=pool, mamba_map={1: 0, 3: 1}))
    primary, child = ReplaySSMMamba2AttnBackend(runner), ReplaySSMMamba2AttnBackend(runner)  # e.g. TBO children
    A_all, dtb_all = pool.replayssm_mamba2_params
    assert primary._A_all is A_all and child._A_all is A_all and child._dtb_all is dtb_all
    fold_before = pool.replayssm_fold_fn
    ReplaySSMMamba2AttnBackend(runner)  # a third instance must not re-register the fold
    assert pool.replayssm_fold_fn is fold_before
    mixer = SimpleNamespace(A=torch.tensor([-1.0, -2.0, -3.0, -4.0]), D=torch.ones(NH, dtype=bf16),
                            dt_bias=torch.full((NH,), 0.5, dtype=bf16))
    primary._layer_params(mixer, 3)  # only the primary runs the layers
    assert A_all[1].tolist() == [-1.0, -2.0, -3.0, -4.0] and dtb_all[1].tolist() == [0.5] * NH
    assert A_all[0].tolist() == [0.0] * NH


# ------------------------------------------------------------------------------ slot allocation


@pytest.fixture
def alloc_hooks():
    specs = {s.name: s for s in sglang_replayssm.table().hooks}
    names = ("pool.class", "pool.alloc_reset", "pool.donate_reset", "pool.allocator_link", "pool.slot_alloc_reset")
    for n in names:
        assert hooks.install(specs[n]) in ("applied", "already applied"), n
    yield
    for n in reversed(names):
        hooks.remove(n)
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool


def test_every_allocated_slot_starts_with_empty_rings(alloc_hooks):
    with pool_build_context(PoolBuildContext(family="gdn", ring_len=4, act_dtype=bf16)):
        rp = HybridReqToTokenPool(
            size=4, mamba_size=8, mamba_spec_state_size=4, max_context_len=16, device="cpu",
            enable_memory_saver=False, cache_params=gdn_params(), mamba_layer_ids=[0, 2],
            enable_mamba_extra_buffer=True, enable_overlap_schedule=True,
        )
    pool = rp.mamba_pool
    assert isinstance(pool, ReplaySSMMambaPool) and rp.mamba_allocator._replayssm_pool is pool
    # every slot carries the rings and cursors of an earlier life (a finished request's working slot)
    gen = torch.Generator().manual_seed(1)
    for t in pool.replayssm_rings.tensors():
        t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
    pool.replayssm_wpos.fill_(3)
    pool.replayssm_origin.fill_(1)
    r = fake_req()
    rp.alloc([r])
    track = [int(s) for s in r.mamba_ping_pong_track_buffer if int(s) >= 0]
    taken = [int(r.mamba_pool_idx), *track]
    assert len(track) == 2
    for s in taken:
        assert (int(pool.replayssm_wpos[s]), int(pool.replayssm_origin[s])) == (0, 0), s
    # radix-cache slots (donation replacement, copy-on-write destination) and grouped allocation
    direct = int(rp.mamba_allocator.alloc(1))
    rp.mamba_allocator.alloc_group_begin(2)
    grouped = int(rp.mamba_allocator.alloc(1))
    rp.mamba_allocator.alloc_group_end()
    for s in (direct, grouped):
        assert (int(pool.replayssm_wpos[s]), int(pool.replayssm_origin[s])) == (0, 0), s
    assert int(pool.replayssm_wpos[int(rp.mamba_allocator.free_slots[0])]) == 3, "reset when taken, not before"

    # cache_finished_req (extra_buffer) inserts the kept track slot as is; a later prefix hit
    # copies it (copy-on-write): the copy must be the tracked checkpoint itself
    keep = track[rp.get_mamba_ping_pong_keep_idx(r)]
    temporal = pool.mamba_cache.temporal
    temporal[:, keep] = torch.randn(temporal[:, keep].shape)  # the track copy wrote a full state
    dst = int(rp.mamba_allocator.alloc(1))
    pool.copy_from(torch.tensor([keep]), torch.tensor([dst]))
    assert torch.equal(temporal[:, dst], temporal[:, keep])


# ------------------------------------------------------------------------------ speculative commit


class _ConvScatterRecorder:
    def __init__(self):
        self.calls = []

    def __call__(self, dst, src, dst_indices, step_indices):
        self.calls.append((dst, src, dst_indices.tolist(), step_indices.tolist()))


@pytest.fixture
def commit_env(monkeypatch):
    """SGLang's conv-window scatter is CUDA-only: record its calls. Track interval 8."""
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton
    from sglang.srt.speculative import spec_utils

    rec = _ConvScatterRecorder()
    monkeypatch.setattr(mamba_state_scatter_triton, "fused_conv_window_scatter_with_mask", rec)
    monkeypatch.setattr(spec_utils, "get_exec", lambda: SimpleNamespace(mamba=SimpleNamespace(mamba_track_interval=8)))
    return rec


def _worker_and_batch(pool, mapping, req_pool_indices, seq_lens, track_indices=None):
    rp = SimpleNamespace(mamba_pool=pool, get_mamba_indices=lambda i: mapping[i])
    worker = SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=rp))
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=req_pool_indices,
                            seq_lens=seq_lens, mamba_track_indices=track_indices)
    return worker, batch


def _chain_accept_index(accept_lens, T):
    bs = accept_lens.shape[0]
    idx = torch.full((bs, T), -1, dtype=torch.int64)
    for i, a in enumerate(accept_lens.tolist()):
        idx[i, :a] = i * T + torch.arange(a)
    return idx


def test_commit_matches_sglang_recurrence_and_tracks_the_crossing_state(commit_env):
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update as sglang_gdn,
    )

    from replayssm_kernels.gdn import gdn_replay_verify
    from sglang_replayssm.backends.commit import commit_after_verify

    gen = torch.Generator().manual_seed(13)
    H, HV, K, V, L, T = 1, 2, 16, 16, 6, 4
    pool = build_pool("gdn", gdn_params(H, HV, K, V, layers=(0,)), size=8, ring_len=L, draft=T, topk=1)
    temporal = pool.mamba_cache.temporal
    mapping = torch.tensor([2, 5], dtype=torch.int32)
    slots = mapping.clone()
    S0 = torch.randn(2, HV, V, K, generator=gen) * 0.1
    temporal[0, slots.long()] = S0
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)

    def r(*shape):
        return torch.randn(*shape, generator=gen).to(bf16)

    q, k, v, a, b = r(2, T, H, K), r(2, T, H, K), r(2, T, HV, V), r(2, T, HV), r(2, T, HV)
    gdn_replay_verify(q, k, v, a, b, A_log, dt_bias, temporal[0], pool.replayssm_layer_rings[0], slots,
                      pool.replayssm_wpos, pool.replayssm_origin)

    accept_lens = torch.tensor([2, 4], dtype=torch.int32)  # bonus token included
    seq_lens = torch.tensor([5, 6])  # row 1 crosses the track interval (8) after its 2nd window token
    track = torch.tensor([3, 7])
    worker, batch = _worker_and_batch(pool, mapping, torch.tensor([0, 1]), seq_lens, track)
    commit_after_verify(None, worker, batch, accept_lens, _chain_accept_index(accept_lens, T), T)

    def reference(row, n):
        S = S0[row].unsqueeze(0).clone()
        for t in range(n):
            def tok(x):
                return x[row:row + 1, t:t + 1].contiguous()

            sglang_gdn(A_log=A_log, dt_bias=dt_bias, q=tok(q), k=tok(k), v=tok(v), a=tok(a)[:, 0], b=tok(b)[:, 0],
                       initial_state_source=S,
                       initial_state_indices=torch.tensor([0], dtype=torch.int32),
                       cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                       softplus_beta=1.0, softplus_threshold=20.0)
        return S[0]

    # row 0: 2 + T > L? no (2 + 4 = 6): pending; row 1: 4 + 4 > 6: folded, track snapshot on the way
    assert pool.replayssm_wpos[slots.long()].tolist() == [2, 0]
    assert torch.equal(temporal[0, 7], reference(1, 2)), "track slot must hold the state at the interval boundary"
    assert torch.equal(temporal[0, 5], reference(1, 4))
    pool.copy_from(torch.tensor([2]), torch.tensor([8]))
    assert torch.equal(temporal[0, 8], reference(0, 2))
    # conv rollback exactly as scatter_mamba_states_after_mtp_verify does it
    conv, windows = pool.mamba_cache.conv[0], pool.mamba_cache.intermediate_conv_window[0]
    calls = commit_env.calls
    assert [(c[2], c[3]) for c in calls] == [([2, 5], [1, 3]), ([3, 7], [-1, 1])]
    assert all(c[0] is conv and c[1] is windows for c in calls)


def test_commit_early_flush_leaves_room_for_the_largest_window(commit_env):
    """Adaptive speculation verifies with a window of this step's size but may switch to the
    largest (--max-speculative-num-draft-tokens) next step: the commit keeps room for it."""
    from sglang_replayssm.backends.commit import commit_after_verify

    L, T_max, T = 6, 4, 2
    pool = build_pool("gdn", gdn_params(layers=(0,)), size=4, ring_len=L, draft=T_max, topk=1)
    mapping = torch.tensor([1, 2], dtype=torch.int32)
    pool.replayssm_wpos[1] = 1
    worker, batch = _worker_and_batch(pool, mapping, torch.tensor([0, 1]), torch.tensor([5, 5]))
    accept_lens = torch.tensor([2, 1], dtype=torch.int32)
    commit_after_verify(None, worker, batch, accept_lens, _chain_accept_index(accept_lens, T), T)
    # row 0: 1 + 2 = 3 pending, 3 + 4 > 6 -> folded (a margin of T=2 would keep 3 and let the next
    # 4-token window overrun the ring); row 1: 1 + 4 <= 6 -> stays pending
    assert pool.replayssm_wpos[[1, 2]].tolist() == [0, 1]
    assert pool.replayssm_origin[[1, 2]].tolist() == [3, 0]
    assert [(c[2], c[3]) for c in commit_env.calls] == [([1, 2], [1, 0])]


def test_commit_chain_steps_equal_sglangs_tree_form(commit_env):
    """The commit takes its step indices from the linear chain (acc - 1; with a radix track, the
    step reaching the next track-interval multiple, from the lengths, in our own launch); they must
    be what SGLang's tree-general `_verify_commit_step_indices` gives for the same accept_index, at
    every accept count and draft length, with and without tracking (interval 8 here), crossing
    or not."""
    from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

    from sglang_replayssm.backends.commit import commit_after_verify

    gen = torch.Generator().manual_seed(5)
    crossed = 0
    for T in (2, 4, 6):
        for tracked in (False, True):
            bs = 7
            pool = build_pool("gdn", gdn_params(layers=(0,)), size=2 * bs + 1, ring_len=4 * T, draft=T, topk=1)
            mapping = torch.arange(1, bs + 1, dtype=torch.int32)
            seq_lens = torch.randint(1, 40, (bs,), generator=gen, dtype=torch.int64)
            track = torch.arange(bs + 1, 2 * bs + 1, dtype=torch.int64) if tracked else None
            worker, batch = _worker_and_batch(pool, mapping, torch.arange(bs), seq_lens, track)
            accept_lens = torch.randint(1, T + 1, (bs,), generator=gen, dtype=torch.int32)
            accept_index = _chain_accept_index(accept_lens, T)
            commit_env.calls.clear()
            commit_after_verify(None, worker, batch, accept_lens, accept_index, T)
            last, steps = _verify_commit_step_indices(batch=batch, accept_index=accept_index,
                                                      accept_lens=accept_lens, draft_token_num=T)
            want = [(mapping.tolist(), last.tolist())]
            if tracked:
                want.append((track.tolist(), steps.tolist()))
                crossed += int((steps >= 0).sum())
            assert [(c[2], c[3]) for c in commit_env.calls] == want, (T, tracked, accept_lens.tolist())
    assert crossed > 0


# ------------------------------------------------------------------------------ radix cache, no_buffer


def test_no_buffer_finish_donates_the_slot_with_its_pending_entries(alloc_hooks, monkeypatch):
    """`MambaRadixCache.cache_finished_req` (no_buffer) inserts the request's own slot, keyed with
    the full length, and caps the key by `mamba_pool.replayssm_write_pos` only when that attribute
    is set (SGLang's own ring). Ours stays None: the slot enters the tree with its checkpoint, its
    pending ring entries and their cursors, and the copy-on-write of a prefix hit folds them, so
    the new request starts from SGLang's recurrent state over every cached token, bit for bit."""
    from array import array

    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update as sglang_gdn,
    )
    from sglang.srt.mem_cache import mamba_radix_cache as mrc
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from replayssm_kernels import decode_prepare
    from replayssm_kernels.gdn import gdn_replay_decode

    monkeypatch.setattr(mrc, "get_server_args", lambda: SimpleNamespace(mamba_cache_chunk_size=64))
    kv = object.__new__(TokenToKVPoolAllocator)  # only `device` and `free_segment` are reached
    kv.device = torch.device("cpu")
    kv.free_segment = lambda *a, **k: None
    H, HV, K, V = 1, 2, 16, 16
    with pool_build_context(PoolBuildContext(family="gdn", ring_len=4, act_dtype=bf16)):
        rp = HybridReqToTokenPool(
            size=4, mamba_size=6, mamba_spec_state_size=4, max_context_len=32, device="cpu",
            enable_memory_saver=False, cache_params=gdn_params(H, HV, K, V, layers=(0,)), mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False, enable_overlap_schedule=False,
        )
    pool = rp.mamba_pool
    assert pool.replayssm_write_pos is None
    cache = mrc.MambaRadixCache(CacheInitParams(disable=False, req_to_token_pool=rp, token_to_kv_pool_allocator=kv,
                                                page_size=1))

    # request r: prefill (checkpoint S0), then 6 decode tokens on a ring of 4 -> 2 pending at finish
    gen = torch.Generator().manual_seed(21)
    r = fake_req()
    r.origin_input_ids, r.output_ids = array("q", range(10, 20)), array("q")  # as Req keeps them
    r.extra_key, r.cache_protected_len = None, 0
    rp.alloc([r])
    slot = int(r.mamba_pool_idx)
    temporal = pool.mamba_cache.temporal
    S0 = torch.randn(HV, V, K, generator=gen) * 0.1
    temporal[0, slot] = S0
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    ref = S0.unsqueeze(0).clone()
    idx = torch.tensor([slot], dtype=torch.int32)
    for step in range(6):
        q, k = torch.randn(1, H, K, generator=gen).to(bf16), torch.randn(1, H, K, generator=gen).to(bf16)
        v = torch.randn(1, HV, V, generator=gen).to(bf16)
        a, b = torch.randn(1, HV, generator=gen).to(bf16), torch.randn(1, HV, generator=gen).to(bf16)
        row_wp, row_flush = decode_prepare(idx, pool.replayssm_wpos, 4)
        gdn_replay_decode(q, k, v, a, b, A_log, dt_bias, temporal[0], pool.replayssm_layer_rings[0], idx, row_wp,
                          row_flush, pool.replayssm_origin)
        sglang_gdn(A_log=A_log, dt_bias=dt_bias, q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), a=a, b=b,
                   initial_state_source=ref, initial_state_indices=torch.tensor([0], dtype=torch.int32),
                   cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                   softplus_beta=1.0, softplus_threshold=20.0)
        r.output_ids.append(100 + step)
    assert int(pool.replayssm_wpos[slot]) == 2 and not torch.equal(temporal[0, slot], ref[0])
    tokens = r.origin_input_ids + r.output_ids  # the state covers all 16 tokens
    rp.req_to_token[r.req_pool_idx, : len(tokens)] = torch.arange(1, len(tokens) + 1, dtype=rp.req_to_token.dtype)
    r.last_node = cache.root_node

    cache.cache_finished_req(r, kv_len_to_handle=len(tokens))

    assert int(pool.replayssm_wpos[slot]) == 2, "the donated slot keeps its pending entries"
    q_req = fake_req()
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens), cow_mamba=True, req=q_req))
    assert len(m.device_indices) == len(tokens), "the tree keys the donated slot with the full length"
    assert int(q_req.mamba_cow_src_index) == slot
    # model_runner._maybe_execute_deferred_mamba_cow_and_clear
    dst = q_req.mamba_pool_idx.reshape(1)
    pool.copy_from(q_req.mamba_cow_src_index.reshape(1), dst)
    assert torch.equal(temporal[0, int(dst)], ref[0])
    assert (int(pool.replayssm_wpos[int(dst)]), int(pool.replayssm_origin[int(dst)])) == (0, 0)


def test_commit_hook_host_work_per_verify_step(commit_env, monkeypatch):
    """At small batches a verify step is host-bound, so the commit hook's own host work is pinned:
    one launch for the step indices, cursors and track plan, one fold launch for all layers,
    SGLang's conv rollback, and no other torch op. SGLang's `_verify_commit_step_indices` (a dozen
    small ops, ~0.4-0.55 ms of host time per step at C=1 in session 21's samples, both sides) is
    not called: the one launch computes its values for the linear chain."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from sglang.srt.speculative import spec_utils
    from sglang_replayssm.backends import commit as commit_mod

    pool = build_pool("gdn", gdn_params(layers=(0,)), size=8, ring_len=8, draft=4, topk=1)
    mapping = torch.tensor([2, 5], dtype=torch.int32)
    worker, batch = _worker_and_batch(pool, mapping, torch.tensor([0, 1]), torch.tensor([5, 6]),
                                      torch.tensor([3, 7]))
    accept_lens = torch.tensor([2, 4], dtype=torch.int32)
    accept_index = _chain_accept_index(accept_lens, 4)
    plan = tuple(torch.zeros(2, dtype=torch.int32) for _ in range(6))
    launches = []
    counting = [True]
    ops = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if counting[0]:
                ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def uncounted(fn, *a, **kw):
        counting[0] = False
        try:
            return fn(*a, **kw)
        finally:
            counting[0] = True

    def refused(**kw):
        raise AssertionError("the commit hook called SGLang's _verify_commit_step_indices")

    monkeypatch.setattr(spec_utils, "_verify_commit_step_indices", refused)
    # SGLang's slot lookup (stock runs it too) is not counted.
    rp = worker.model_runner.req_to_token_pool
    rp.get_mamba_indices = lambda i, _real=rp.get_mamba_indices: uncounted(_real, i)
    monkeypatch.setattr(commit_mod, "commit_prepare_chain_tracked", lambda *a, **k: launches.append("commit") or plan)
    monkeypatch.setattr(pool, "replayssm_fold_fn", lambda *a, **k: launches.append("fold"))
    with Count():
        commit_mod.commit_after_verify(None, worker, batch, accept_lens, accept_index, 4)
    assert launches == ["commit", "fold"]
    assert len(commit_env.calls) == 2  # conv rollback: accepted step and track step, as stock
    assert ops == [], ops
