"""Hook table for SGLang 0.5.17 (torch 2.11, sglang-kernel 0.4.5).

Every SGLang symbol the plugin touches is named here, once. Line numbers are anchors in the
installed wheel (`sglang/srt/...`), see /work/shared/notes/sglang.md for the surrounding code.

Tiers (see `sglang_replayssm.compat`):

* cli      installed by `register()` in every process. They only add the `replayssm` choice and
           the `--replayssm-ring-len` option and run the validation, which does nothing unless
           `mamba_backend == "replayssm"`. With another backend SGLang behaves byte-identically.
* probe    installed by `register()` where the target module is already imported (scheduler
           subprocesses, where `run_scheduler_process` calls `load_plugins()`); a pass-through for
           other backends.
* runtime  installed only in a process that serves `--mamba-backend replayssm` (by the final
           validation hook in the launcher, by the scheduler probe in every scheduler process),
           and only those needed by the model family (and speculative decoding).
"""

from sglang_replayssm.compat import (
    AFTER,
    AROUND,
    BEFORE,
    DICT_ITEM,
    LIST_APPEND,
    REPLACE_CLASS,
    SET_ATTR,
    TIER_CLI,
    TIER_PROBE,
    TIER_RUNTIME,
    HookSpec,
)

SGLANG_VERSION = "0.5.17"

_SA = "sglang.srt.server_args"
_POOL = "sglang.srt.mem_cache.memory_pool"
_KVCC = "sglang.srt.mem_cache.kv_cache_configurator"
_HYBRID = "sglang.srt.layers.attention.hybrid_linear_attn_backend"

HOOKS = (
    # ---------------------------------------------------------------- cli tier
    HookSpec(
        name="cli.mamba_backend_choice",
        target=f"{_SA}:MAMBA_BACKEND_CHOICES",
        kind=LIST_APPEND,
        value="replayssm",
        tier=TIER_CLI,
        why="server_args.py L365: module-level list passed by reference to argparse `choices` "
        "of --mamba-backend (L1787); appending makes `replayssm` a valid value.",
    ),
    HookSpec(
        name="cli.add_cli_args",
        target=f"{_SA}:ServerArgs.add_cli_args",
        kind=AFTER,
        impl="sglang_replayssm.args:after_add_cli_args",
        tier=TIER_CLI,
        why="server_args.py L8214 (staticmethod): add --replayssm-ring-len and make sure the "
        "--mamba-backend action accepts `replayssm` even if the choices list was copied.",
    ),
    HookSpec(
        name="cli.from_cli_args",
        target=f"{_SA}:ServerArgs.from_cli_args",
        kind=AROUND,
        impl="sglang_replayssm.args:around_from_cli_args",
        tier=TIER_CLI,
        why="server_args.py L8463 (classmethod) builds ServerArgs from dataclass fields only; "
        "the wrapper hands the parsed --replayssm-ring-len to the validation that runs inside "
        "the constructor.",
    ),
    HookSpec(
        name="validate.post_init",
        target=f"{_SA}:ServerArgs.__post_init__",
        kind=AROUND,
        impl="sglang_replayssm.validation:around_post_init",
        tier=TIER_CLI,
        why="server_args.py L3435. Before SGLang's handlers: checks on user-given flags (PD "
        "mode, unified memory, SSM dtype, upstream ReplaySSM flags, ring length) and forcing "
        "--mamba-ssm-dtype float32 before _handle_linear_attn_backend and "
        "_handle_environment_variables (which exports SGLANG_MAMBA_SSM_DTYPE) read it. After: "
        "speculative checks, which must follow handle_speculative_decoding (L3590; NGRAM sets "
        "speculative_eagle_topk there); stores the validated ring length on the instance and "
        "installs the runtime hooks in this process.",
    ),
    HookSpec(
        name="validate.family",
        target=f"{_SA}:ServerArgs._handle_mamba_backend",
        kind=AFTER,
        impl="sglang_replayssm.validation:after_handle_mamba_backend",
        tier=TIER_CLI,
        why="server_args.py L5951, called from __post_init__ L3541 after the model config is "
        "loaded: refuse non-hybrid models and unsupported linear-attention families.",
    ),
    # -------------------------------------------------------------- probe tier
    HookSpec(
        name="runtime.scheduler_probe",
        target="sglang.srt.managers.scheduler:Scheduler.__init__",
        kind=BEFORE,
        impl="sglang_replayssm.runtime:before_scheduler_init",
        tier=TIER_PROBE,
        why="scheduler.py L374: every scheduler process (run_scheduler_process L4879 calls "
        "load_plugins() first, Ray actors construct Scheduler directly) receives the pickled "
        "ServerArgs here, before the model runner builds pools and backends; installs the "
        "runtime hooks when it selects replayssm and fails the scheduler loudly otherwise.",
    ),
    # ------------------------------------------------------------ runtime tier
    HookSpec(
        name="ssu.registry",
        target="sglang.kernels.ops.mamba.triton_ops.ssu_dispatch:_BACKEND_REGISTRY",
        kind=DICT_ITEM,
        key="replayssm",
        impl="sglang_replayssm.ssu:ReplaySSMSSUBackend",
        tier=TIER_RUNTIME,
        why="ssu_dispatch.py L185: Scheduler.init_mamba_backend (scheduler.py L853) looks "
        "server_args.mamba_backend up in this dict for every model and raises on unknown names.",
    ),
    HookSpec(
        name="pool.class",
        target=f"{_POOL}:HybridReqToTokenPool.mamba_pool_cls",
        kind=SET_ATTR,
        impl="sglang_replayssm.pool:ReplaySSMMambaPool",
        tier=TIER_RUNTIME,
        why="memory_pool.py L1139: _init_mamba_pool (L1206) instantiates self.mamba_pool_cls; "
        "the PD decode pool (disaggregation/decode.py L196) inherits the attribute.",
    ),
    HookSpec(
        name="pool.build_context",
        target=f"{_KVCC}:KVCacheConfigurator._build_hybrid_req_pool",
        kind=AROUND,
        impl="sglang_replayssm.memory:around_build_hybrid_req_pool",
        tier=TIER_RUNTIME,
        why="kv_cache_configurator.py L759: the only place that knows the model family, the "
        "activation dtype (model_dtype) and server_args when the pool is built.",
    ),
    HookSpec(
        name="pool.alloc_reset",
        target=f"{_POOL}:HybridReqToTokenPool.alloc",
        kind=AROUND,
        impl="sglang_replayssm.pool:around_alloc",
        tier=TIER_RUNTIME,
        why="memory_pool.py L1294: a freshly assigned mamba slot must start with empty rings.",
    ),
    HookSpec(
        name="pool.allocator_link",
        target=f"{_POOL}:HybridReqToTokenPool._init_mamba_pool",
        kind=AFTER,
        impl="sglang_replayssm.pool:after_init_mamba_pool",
        tier=TIER_RUNTIME,
        why="memory_pool.py L1191: builds mamba_pool (mamba_pool_cls) and then mamba_allocator "
        "(L1220, a MambaSlotAllocator); links the allocator to the ReplaySSM pool for "
        "pool.slot_alloc_reset.",
    ),
    HookSpec(
        name="pool.slot_alloc_reset",
        target="sglang.srt.mem_cache.allocator.mamba:MambaSlotAllocator._do_alloc",
        kind=AROUND,
        impl="sglang_replayssm.pool:around_slot_alloc",
        tier=TIER_RUNTIME,
        why="allocator/mamba.py L81: the one place slots leave the free list (alloc() and "
        "alloc_group_begin() both go through it). Ping-pong track slots "
        "(memory_pool.py L1400 _alloc_ping_pong_buffer), lazy track slots (schedule_batch.py "
        "L2882) and radix-cache slots (mamba_radix_cache.py L1026/L1165) bypass "
        "HybridReqToTokenPool.alloc; cache_finished_req (extra_buffer, L597) inserts the kept "
        "track slot into the tree without copy_from, so its cursors must be empty.",
    ),
    HookSpec(
        name="pool.donate_reset",
        target=f"{_POOL}:HybridReqToTokenPool.donate_mamba_ping_pong_slot",
        kind=AROUND,
        impl="sglang_replayssm.pool:around_donate",
        tier=TIER_RUNTIME,
        why="memory_pool.py L1438: extra_buffer donation swaps slots without copy_from, so the "
        "cursors of the donated and the replacement slot are reset here.",
    ),
    HookSpec(
        name="memory.solver",
        target=f"{_KVCC}:KVCacheConfigurator._handle_max_mamba_cache",
        kind=AROUND,
        impl="sglang_replayssm.memory:around_handle_max_mamba_cache",
        tier=TIER_RUNTIME,
        why="kv_cache_configurator.py L1816: no intermediate_ssm reservation under replayssm, "
        "ring bytes charged per slot.",
    ),
    HookSpec(
        name="backend.gdn",
        target="sglang.srt.layers.attention.linear.gdn_backend:GDNAttnBackend",
        kind=REPLACE_CLASS,
        impl="sglang_replayssm.backends.gdn:ReplaySSMGDNAttnBackend",
        tier=TIER_RUNTIME,
        families=("gdn",),
        why="attention_registry.py L309 imports GDNAttnBackend lazily inside "
        "attn_backend_wrapper (L420), so replacing the module attribute is enough.",
        fix="ship sglang_replayssm/backends/gdn.py (ReplaySSMGDNAttnBackend, a GDNAttnBackend "
        "subclass)",
    ),
    HookSpec(
        name="backend.mamba2",
        target=f"{_HYBRID}:Mamba2AttnBackend",
        kind=REPLACE_CLASS,
        impl="sglang_replayssm.backends.mamba2:ReplaySSMMamba2AttnBackend",
        tier=TIER_RUNTIME,
        families=("mamba2",),
        why="attention_registry.py L461 imports Mamba2AttnBackend lazily; models assert "
        "isinstance(..., Mamba2AttnBackend), which a subclass satisfies.",
        fix="ship sglang_replayssm/backends/mamba2.py (ReplaySSMMamba2AttnBackend, a "
        "Mamba2AttnBackend subclass)",
    ),
    HookSpec(
        name="commit.after_verify",
        target="sglang.srt.speculative.spec_utils:commit_mamba_states_after_verify",
        kind=AROUND,
        impl="sglang_replayssm.backends.commit:commit_after_verify",
        tier=TIER_RUNTIME,
        spec_only=True,
        why="spec_utils.py L826, name-imported by eagle_worker_common.py L28 and "
        "ngram_worker.py L26 (stale bindings are rebound when installed).",
        fix="ship sglang_replayssm/backends/commit.py (commit_after_verify)",
    ),
    HookSpec(
        name="commit.mtp_verify",
        target=f"{_HYBRID}:HybridLinearAttnBackend.update_mamba_state_after_mtp_verify",
        kind=AROUND,
        impl="sglang_replayssm.backends.commit:update_mamba_state_after_mtp_verify",
        tier=TIER_RUNTIME,
        spec_only=True,
        why="hybrid_linear_attn_backend.py L1183: reached from spec_utils' generic commit and "
        "called directly by the DFlash/DSpark workers.",
        fix="ship sglang_replayssm/backends/commit.py (update_mamba_state_after_mtp_verify)",
    ),
)
