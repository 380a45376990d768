"""The shuffle form's cross-lane sums (`replayssm_kernels/gdn/lanes.py`) without a GPU.

Two things the interpreter cannot show: that the inline PTX adds in the butterfly's order, and
that the compiled kernels hand it each column's partials with lane g on lane id g. The first is
checked by running the PTX text on a 32-lane model of the few instructions it uses; the second by
compiling the kernels that replay in the shuffle form for sm_90 (no device needed) and reading
the layout of every inline-asm operand in their TTGIR. Bit identity with SGLang's kernel on the
H200 is the GPU run's (`REPLAYSSM_CONFIG=gdn_k_tree=2 pytest tests/test_gdn_kernels.py`).
"""

import json
import re

import numpy as np
import pytest

from replayssm_kernels.gdn.lanes import allsum_ptx, shuffles
from script_loader import run_compiled

F = np.float32


def _run_ptx(ptx: str, inputs: np.ndarray) -> np.ndarray:
    """Execute `allsum_ptx`'s text on 32 lanes in lockstep: `inputs` `[32, n]` fp32 -> `[32, n]`."""
    n = inputs.shape[1]
    regs = [dict() for _ in range(32)]
    for lane in range(32):
        for i in range(n):
            regs[lane][f"${n + i}"] = inputs[lane, i]

    def val(lane, x):
        if x == "%laneid":
            return lane
        if re.fullmatch(r"\d+", x):
            return int(x)
        return regs[lane][x]

    lines = [ln.strip().rstrip(";") for ln in ptx.splitlines()]
    for ln in lines:
        if ln in ("{", "}") or ln.startswith(".reg"):
            continue
        op, rest = ln.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        new = []
        for lane in range(32):
            if op == "mov.u32" or op == "mov.b32":
                v = val(lane, args[1])
            elif op == "and.b32":
                v = val(lane, args[1]) & val(lane, args[2])
            elif op == "setp.ne.u32":
                v = val(lane, args[1]) != val(lane, args[2])
            elif op == "selp.b32":
                v = val(lane, args[1]) if val(lane, args[3]) else val(lane, args[2])
            elif op == "add.rn.f32":
                v = F(val(lane, args[1])) + F(val(lane, args[2]))
            elif op == "shfl.sync.bfly.b32":
                assert args[3:] == ["0x1f", "0xffffffff"], ln
                v = val(lane ^ val(lane, args[2]), args[1])
            elif op == "shfl.sync.idx.b32":
                assert args[3:] == ["0x1f", "0xffffffff"], ln
                v = val(val(lane, args[2]) & 31, args[1])
            else:
                raise AssertionError(f"instruction the model does not know: {ln}")
            new.append(v)
        for lane in range(32):  # all lanes read before any writes (a shuffle reads the old values)
            regs[lane][args[0]] = new[lane]
    return np.array([[regs[lane][f"${i}"] for i in range(n)] for lane in range(32)], dtype=F)


def _butterfly(partials: np.ndarray) -> np.ndarray:
    """SGLang's cross-lane order: lane g adds lane g ^ 16, then ^ 8, 4, 2, 1 (every lane ends
    with the same bits). `[32, n]` -> `[32, n]`."""
    s = partials.copy()
    for m in (16, 8, 4, 2, 1):
        s = s + s[[g ^ m for g in range(32)]]
    return s


def _partials(n, seed):
    """Values whose sum depends on the order of the additions (wide exponent range)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((32, n)) * np.exp2(rng.integers(-20, 20, (32, n)))).astype(F)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32])
def test_allsum_ptx_adds_in_the_butterfly_order(n):
    """Every lane gets every column's butterfly sum, bit for bit, with the advertised shuffles."""
    ptx = allsum_ptx(n)
    assert len(re.findall(r"shfl\.sync", ptx)) == shuffles(n)
    for seed in range(3):
        x = _partials(n, seed)
        assert np.array_equal(_run_ptx(ptx, x).view(np.uint32), _butterfly(x).view(np.uint32)), f"seed {seed}"


def test_allsum_model_tells_orders_apart():
    """A PTX that pairs the lanes in another order (distances 8 and 16 swapped) ends in other
    bits, and so do one that keeps the wrong half and one that reads a column from the wrong lane."""
    x = _partials(8, 7)
    want = _butterfly(x).view(np.uint32)
    ptx = allsum_ptx(8)
    swapped = (ptx.replace(", 16, 0x1f", ", 99, 0x1f").replace(", 8, 0x1f", ", 16, 0x1f")
               .replace(", 99, 0x1f", ", 8, 0x1f"))
    assert not np.array_equal(_run_ptx(swapped, x).view(np.uint32), want)
    p = next(ln for ln in ptx.splitlines() if ln.startswith("selp.b32"))
    a, b = re.match(r"selp\.b32 (\w+), (\S+), (\S+), (\w+);", p).group(2, 3)
    wrong_half = ptx.replace(p, p.replace(f"{a}, {b}", f"{b}, {a}"), 1)
    assert not np.array_equal(_run_ptx(wrong_half, x).view(np.uint32), want)
    wrong_lane = ptx.replace(", 4, 0x1f, 0xffffffff;\nshfl.sync.idx", ", 8, 0x1f, 0xffffffff;\nshfl.sync.idx", 1)
    assert wrong_lane != ptx
    assert not np.array_equal(_run_ptx(wrong_lane, x).view(np.uint32), want)


def test_allsum_width_is_checked():
    with pytest.raises(ValueError, match="1, 2, 4, 8, 16 or 32"):
        allsum_ptx(3)


def test_shuffle_form_kernels_put_lane_g_on_lane_id_g():
    """The sm_90 build of every kernel that replays in the shuffle form (fold, decode flush
    launch, decode plan-3 state launch; `scripts/kernel_regs.py --shuffle-form`) hands each
    inline-asm op an `[N, 32]` tensor with the 32 lanes of one warp along axis 1 and the N
    columns in every thread's registers, which is what its PTX assumes; and the PTX holds the
    shuffles of the shuffle form, not the butterfly's 5 per column."""
    rows = [json.loads(ln) for ln in run_compiled("kernel_regs", "--shuffle-form").splitlines() if ln.startswith("{")]
    assert {r["name"].split(" shuffle")[0] for r in rows} == {"fold", "decode plan 3 state launch",
                                                              "decode flush launch"}
    for r in rows:
        cols = int(re.search(r"(?:cols|flushcols)(\d+)", r["name"]).group(1))
        assert r["asm_operands"], f"{r['name']}: no inline asm (the shuffle form was not compiled)"
        for shape, layout in r["asm_operands"]:
            assert shape == f"{cols}x32", (r["name"], shape)
            assert "#ttg.blocked<" in layout and "sizePerThread = [1, 1]" in layout, (r["name"], layout)
            assert "threadsPerWarp = [1, 32]" in layout and "warpsPerCTA = [1, 1]" in layout, (r["name"], layout)
        assert r["spill_stores"] == 0, r
    fold8 = next(r for r in rows if r["name"] == "fold shuffle cols8")
    # 4 sub-tiles of 8 columns, one all-sum each per entry: 17 shuffles each, no key norm.
    assert fold8["shfl"] == 4 * shuffles(8), fold8
