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
    # SGLang's own spec path keeps one draft window (T = 4) of raw v and raw k (bf16) and fp32 g and
    # beta per layer and slot (its server logged 0.217 GiB for 129 slots of this model, session 49).
    up_layer = (32 * 4 * 128 * 2 + 16 * 4 * 128 * 2 + 32 * 4 * 4 + 32 * 4 * 4) / (1 << 20)
    assert abs(q["upstream_spec_rings_mib"] - 36 * up_layer) < 1e-6
    assert q["fit_stock_spec"] < q["fit_ours"] < q["fit_upstream_spec"] < q["fit_stock"]
    assert q["radix_fit_ours"] < q["radix_fit_upstream_spec"]
    for name in ("nemotron-nano-9b-v2", "nemotron-3-super"):  # SGLang's own ReplaySSM is GDN-only
        assert rows[name]["upstream_spec_rings_mib"] is None and rows[name]["fit_upstream_spec"] is None
    for r in rows.values():
        assert r["fit_stock_spec"] < r["fit_ours"] < r["fit_stock"]
        assert r["fit_ours"] >= 4 * r["fit_stock_spec"], r["model"]
        assert r["radix_fit_ours"] > r["radix_fit_stock_spec"]
    md = mm.markdown(list(rows.values()), 40)
    assert "| ours vs stock spec |" in md and "| SGLang's own spec: + rings (MiB) |" in md
    assert f"| {q['fit_stock']} / {q['fit_stock_spec']} / {q['fit_upstream_spec']} / {q['fit_ours']} |" in md
