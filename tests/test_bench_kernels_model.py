"""The traffic model behind bench_kernels.py's GB/s column (GDN ring decode): what the raw-key
ring adds, and that it follows the rings the replay form allocates (gdn/rings.py)."""

from replayssm_kernels.configs import override
from script_loader import load_script

bk = load_script("bench_kernels")


def test_gdn_decode_bytes_follow_the_raw_key_ring():
    B, H, HV, K, V, L = 256, 16, 32, 128, 128, 16
    for act in (2, 4):  # bf16 / fp32 activations
        kept = bk.gdn_decode_bytes_ours(B, H, HV, K, V, L, act, raw_keys=True)
        lean = bk.gdn_decode_bytes_ours(B, H, HV, K, V, L, act, raw_keys=False)
        # Per cycle of L steps: the L - 1 appends write no raw key, and the flush's L - 1 replayed
        # entries read the fp32 normalised key instead of the raw one (with bf16 activations the
        # two cancel: the saving is memory, not traffic).
        per_cycle = (L - 1) * H * K * act - (L - 1) * H * K * (4 - act)
        assert kept - lean == B * per_cycle / L
        with override("gdn_k_tree", (0,)):
            assert bk.gdn_decode_bytes_ours(B, H, HV, K, V, L, act) == kept
        with override("gdn_k_tree", (2,)):
            assert bk.gdn_decode_bytes_ours(B, H, HV, K, V, L, act) == lean
    assert kept - lean == B * 15 * 16 * 128 * 4 / 16  # fp32: 122880 bytes a cycle per row


def test_gdn_decode_bytes_with_half_reads_drop_half_the_output_only_state_reads():
    """Split checkpoints (gdn/ckpt.py): the L - 1 output-only steps of a cycle read half the state
    (the hi plane); the flush step reads and writes all of it."""
    B, H, HV, K, V, L = 256, 16, 32, 128, 128, 16
    full = bk.gdn_decode_bytes_ours(B, H, HV, K, V, L, raw_keys=False)
    half = bk.gdn_decode_bytes_ours(B, H, HV, K, V, L, raw_keys=False, half_reads=True)
    st = B * bk.gdn_state_bytes(HV, V, K)
    assert full - half == (L - 1) * (st // 2) / L
