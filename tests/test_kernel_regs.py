"""scripts/kernel_regs.py's offline screens (sm_90 builds and their SASS, no GPU): they run, and
they show what the launch options exist for. A kernel change that loses an option's point (the
shuffle form back at the butterfly's shuffles, the tensor-core state launch compiled without
tensor-core instructions) fails here before it costs device time."""

from script_loader import run_compiled, run_compiled_process


def _table(flag):
    lines = [ln for ln in run_compiled("kernel_regs", flag).splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    return {r[0]: dict(zip(head[1:], r[1:])) for r in rows}


def test_replay_loop_screen():
    t = _table("--replay-loop")
    assert set(t) == {"plain", "tree", "shuffle"}
    n = {k: int(v["SASS instructions"]) for k, v in t.items()}
    shfl = {k: int(v["SHFL"]) for k, v in t.items()}
    assert shfl["plain"] == 45  # 5 butterfly steps for each of 8 columns, 5 for the key's norm
    assert shfl["shuffle"] < shfl["plain"] / 2 and n["shuffle"] < n["plain"]
    assert int(t["shuffle"]["LDG"]) == 4  # k, v, g, beta per entry
    assert int(t["tree"]["BAR"]) > 0 and int(t["plain"]["BAR"]) == int(t["shuffle"]["BAR"]) == 0


def test_state_launch_screen():
    t = _table("--state-launch")
    per16 = "warp instructions per 16 value rows"
    default = t["default: warp reductions, K chunks of 32"]
    assert int(default["MMA"]) == 0
    tc = {k: v for k, v in t.items() if k.startswith("tensor cores")}
    assert len(tc) >= 3
    for name, row in tc.items():
        assert int(row["MMA"]) > 0, name
        if "programs per row and value head" not in name:  # loop splits: small-batch plans, see below
            assert int(row[per16]) < int(default[per16]), name
    # Loop splits (gdn_verify_loop_split): each program still makes the prep's products, so one tile
    # per program costs the whole program per tile (latency plans for small batches), two shares
    # stay well under the per-tile default per 16 rows.
    split = {k: v for k, v in tc.items() if "programs per row and value head" in k}
    assert len(split) == 2 and all(int(v["spills (B)"]) == 0 for v in split.values())
    one_tile = next(v for k, v in split.items() if "one tile each" in k)
    assert int(one_tile[per16]) == int(one_tile["SASS instructions"]) and int(one_tile["async copies"]) == 0
    two = next(v for k, v in split.items() if "2 programs" in k)
    assert int(two[per16]) < int(default[per16]) and int(two["async copies"]) > 0
    assert int(t["tensor cores, 64 rows, 4 warps"]["spills (B)"]) == 0
    # Verify plan products 5: the loop body per 16 value rows well under the per-tile program's,
    # its tile loads software-pipelined (asynchronous copies), no spills.
    loop = {k: v for k, v in tc.items() if "one program per row and value head" in k}
    assert len(loop) >= 2
    per_tile = int(t["tensor cores (gdn_state_dot)"][per16])
    for name, row in loop.items():
        assert int(row[per16]) < 0.6 * per_tile, name
        assert int(row["async copies"]) > 0 and int(row["spills (B)"]) == 0, name
        assert int(row["SASS instructions"]) > int(row[per16]), name  # a loop, not one tile


def test_pdl_screen():
    """configs.gdn_pdl: built with PDL, the prep launch lets its dependents start and the state
    launch waits once, after every checkpoint-tile load (the overlap is that read); built without,
    neither kernel has a griddepcontrol instruction."""
    t = run_compiled("kernel_regs", "--pdl")
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in t.splitlines()[2:] if ln.startswith("|")]
    assert len(rows) == 8
    for kernel, pdl, dependents, wait, before, after in rows:
        on = pdl == "1"
        if kernel.endswith("prep"):
            assert (int(dependents), int(wait)) == ((1, 0) if on else (0, 0)), kernel
        else:
            assert (int(dependents), int(wait)) == ((0, 1) if on else (0, 0)), kernel
            assert int(before) >= 16 and int(after) == 0, (kernel, pdl)


def test_decode_plan5_register_cap_screen():
    """The served GDN decode plan 5 (split checkpoints, flush capacity, the replay form in effect)
    built with and without a register cap (configs.gdn_decode_maxnreg; the plan's own is 96 since
    session 45): the cap reaches ptxas (at most that many registers, for the plan without the
    capacity too), and the compiler's own choice is above 96, so the cap of 96 raises the programs an
    SM holds (session 44: 128 without, as Nsight Compute read it on the GPU; the plan without the
    capacity 96, as session 43's did)."""
    lines = [ln for ln in run_compiled("kernel_regs", "--decode-plan5", "--caps", "0,96,80").splitlines()
             if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    by = {(r[0], int(r[1])): r for r in rows}
    plans = {r[0] for r in rows}
    served = [p for p in plans if p.endswith("x13")]
    assert len(plans) == 2 and len(served) == 1, plans
    for plan in plans:
        assert int(by[plan, 96][2]) <= 96 and int(by[plan, 80][2]) <= 80, plan
    free, capped = int(by[served[0], 0][2]), int(by[served[0], 96][2])
    assert capped <= 96 < free, (free, capped)
    # the build is the served one (replay form, rings): the plan without the capacity at the 96
    # registers session 43's Nsight Compute read on the GPU (the plain form gives 128)
    (other,) = plans - set(served)
    assert int(by[other, 0][2]) <= 96, by[other, 0]
    assert int(by[served[0], 96][6]) > int(by[served[0], 0][6])


def test_decode_plan5_tensor_core_form_fits_the_cap():
    """Plan 5's tensor-core products (the sixth number 1, session 46) under the served plan's cap of 96:
    no spills. Its probe operand is loaded in the dot's own layout; built from the `[BK]` key and
    query vectors instead, the compiler redid their norms' divisions in that layout (254 registers
    without a cap, 528 bytes of spill stores at 96)."""
    lines = [ln for ln in run_compiled("kernel_regs", "--decode-plan5", "--dot", "--caps", "96").splitlines()
             if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    served = [r for r in rows if r[0].endswith("x13")]
    assert len(served) == 1 and served[0][0].split("x")[5] == "1", rows
    regs, spill_st, spill_ld = (int(x) for x in served[0][2:5])
    assert regs <= 96 and spill_st == 0 and spill_ld == 0, served[0]


def test_decode_plan5_named_plans_build_as_named():
    """`--plans` builds the named plan 5 keys instead of the served one (screens for the next GPU
    sweep): 32-column tiles with the tensor-core form stage a larger tile for the dot than the
    served 16 columns (8192 bytes of shared memory, the test above), and no spills without a cap;
    a key that is not plan 5 is refused with the flag's name, and so is `--dot` beside `--plans`
    (each key's sixth number sets the form)."""
    lines = [ln for ln in run_compiled("kernel_regs", "--decode-plan5", "--caps", "0",
                                       "--plans", "5x32x1x1x8x1x1x1x4x13").splitlines() if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [r[0] for r in rows] == ["5x32x1x1x8x1x1x1x4x13", "5x32x1x1x8x1x1x1x4 (no capacity)"], rows
    for r in rows:
        assert int(r[3]) == 0 and int(r[4]) == 0 and int(r[5]) > 8192, r
    bad = run_compiled_process("kernel_regs", "--decode-plan5", "--plans", "3x16x1x3x8x0x1", timeout=300)
    assert bad.returncode != 0 and "--plans" in bad.stderr and "3x16x1x3x8x0x1" in bad.stderr, bad.stderr[-2000:]
    both = run_compiled_process("kernel_regs", "--decode-plan5", "--dot", "--caps", "0",
                                "--plans", "5x32x1x1x8x1x1x1x4x13", timeout=300)
    assert both.returncode == 2 and "--dot with --plans" in both.stderr, (both.stdout[-1000:], both.stderr[-2000:])
    # A plan the launch refuses (several warps with the served shuffle-form replay) is refused here
    # too, before anything is compiled (session 54 compiled a four-warp plan the launch rejects).
    warps = run_compiled_process("kernel_regs", "--decode-plan5", "--caps", "0",
                                 "--plans", "5x64x4x1x8x1x1x1x8x13", timeout=300)
    assert warps.returncode != 0 and "--plans" in warps.stderr and "one warp" in warps.stderr, warps.stderr[-2000:]
