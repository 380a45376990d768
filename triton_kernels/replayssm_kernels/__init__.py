"""ReplaySSM Triton kernels for Gated DeltaNet and Mamba-2 (no SGLang import).

See docs/design.md for the ring/cursor protocol shared by both families.
"""

from .cursors import (
    commit_prepare,
    commit_prepare_chain_tracked,
    commit_prepare_tracked,
    decode_order_and_index,
    decode_prepare,
    decode_row_order,
    pending_fold_plan,
    reset_cursors,
)

__all__ = ["commit_prepare", "commit_prepare_chain_tracked", "commit_prepare_tracked", "decode_order_and_index",
           "decode_prepare", "decode_row_order", "pending_fold_plan", "reset_cursors"]
