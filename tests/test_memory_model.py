"""scripts/memory_model.py: per-request state bytes from SGLang's own cache parameters, ring bytes
from the plugin's solver, and the concurrency arithmetic (CPU, config-only checkpoints)."""

from script_loader import load_script


def test_memory_model_rows():
    mm = load_script("memory_model")
    rows = {r["model"]: r for r in mm.model_rows(budget_gib=40, ring_len=16, draft=4, ratio=5)}
    q = rows["qwen3-next-80b"]
    # GDN state: HV * V * K fp32 = 2 MiB per layer, conv state on top (36 layers).
    assert 36 * 2.0 < q["state_conv_mib"] < 36 * 2.1
    # Six rings per layer and slot: d, raw v (bf16, HV x L x V), normalised k (fp32) and raw k (bf16,
    # H x L x K), g and beta (fp32, HV x L).
    per_layer = (2 * 32 * 16 * 128 * 2 + 16 * 16 * 128 * 4 + 16 * 16 * 128 * 2 + 2 * 32 * 16 * 4) / (1 << 20)
    assert abs(q["rings_mib"] - 36 * per_layer) < 1e-6
    assert abs(q["intermediate_ssm_mib"] - 4 * q["state_conv_mib"]) < 1e-6
    for r in rows.values():
        assert r["fit_stock_spec"] < r["fit_ours"] < r["fit_stock"]
        assert r["fit_ours"] >= 4 * r["fit_stock_spec"], r["model"]
        assert r["radix_fit_ours"] > r["radix_fit_stock_spec"]
    assert "| ours vs stock spec |" in mm.markdown(list(rows.values()), 40)
