"""In-process stack sampler for diagnosing host overhead in SGLang server processes (device runs).

Not part of the package. Put this folder first on PYTHONPATH and set REPLAYSSM_DIAG_SAMPLE=DIR:
every Python process started then (the launcher, the tokenizer manager, the scheduler, ...)
samples the stacks of all its threads every REPLAYSSM_DIAG_INTERVAL_MS (default 1) and rewrites
DIR/<pid>.json every 5 s with, per thread, the sampled wall seconds and the functions they were spent in
(inclusive: on the stack; self: innermost frame), each sample weighted by the time since the last.
Touching DIR/reset clears every process's counters (a measurement window starts); touching
DIR/dump makes every process write its file now (`bench_serving.py --diag DIR` does both around
each measured case). `scripts/diag/summarize.py` prints them.
Works without ptrace (py-spy needs it); costs the sampled process a little GIL time, the same on
every side of a comparison.

Each file also holds process-wide counters over the same window (`process`): CPU seconds
(user + system), voluntary and involuntary context switches (many involuntary ones = the process
was preempted, i.e. something else wanted its CPU), the garbage collector's collections and
seconds per generation, the CPU affinity, and (in the dump that ends a window) the number of
objects the collector tracks.
"""

import os

_DIR = os.environ.get("REPLAYSSM_DIAG_SAMPLE")

if _DIR:
    import atexit
    import json
    import sys
    import threading
    import time
    from collections import Counter

    def _key(code):
        return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:{code.co_name}"

    import gc
    import resource

    _gc = {}  # generation -> [collections, seconds, objects collected]
    _gc_t0 = [0.0]

    def _gc_cb(phase, info):
        if phase == "start":
            _gc_t0[0] = time.perf_counter()
            return
        rec = _gc.setdefault(str(info.get("generation")), [0, 0.0, 0])
        rec[0] += 1
        rec[1] += time.perf_counter() - _gc_t0[0]
        rec[2] += int(info.get("collected", 0))

    gc.callbacks.append(_gc_cb)

    def _usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return dict(cpu_s=r.ru_utime + r.ru_stime, nvcsw=r.ru_nvcsw, nivcsw=r.ru_nivcsw, t=time.time())

    def _sampler():
        me = threading.get_ident()
        base = [_usage()]
        interval = float(os.environ.get("REPLAYSSM_DIAG_INTERVAL_MS", "1")) / 1000.0
        incl, leaf, count = Counter(), Counter(), Counter()
        names = {}
        last = time.time()
        path = os.path.join(_DIR, f"{os.getpid()}.json")

        def dump(count_objects=True):
            now_u = _usage()
            try:
                affinity = sorted(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                affinity = None
            out = {"pid": os.getpid(), "argv": sys.argv[:4], "threads": {},
                   "process": {
                       "wall_s": now_u["t"] - base[0]["t"],
                       "cpu_s": now_u["cpu_s"] - base[0]["cpu_s"],
                       "voluntary_switches": now_u["nvcsw"] - base[0]["nvcsw"],
                       "involuntary_switches": now_u["nivcsw"] - base[0]["nivcsw"],
                       "gc": {g: list(v) for g, v in sorted(_gc.items())},
                       # Listing every tracked object holds the GIL for a while on a large heap:
                       # only at the end of a window (forced dump, exit), not in the periodic ones.
                       "gc_tracked_objects": len(gc.get_objects()) if count_objects else None,
                       "affinity": affinity,
                   }}
            for tname, n in count.items():
                out["threads"][tname] = {
                    "samples": n,
                    "incl": [(k, c) for (t, k), c in incl.most_common() if t == tname][:400],
                    "self": [(k, c) for (t, k), c in leaf.most_common() if t == tname][:40],
                }
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(out, fh)
            os.replace(tmp, path)

        atexit.register(dump)
        prev = time.perf_counter()
        seen_reset = seen_dump = time.time()
        next_check = 0.0
        while True:
            time.sleep(interval)
            # Weight each sample by the wall time since the previous one: while a thread holds the
            # GIL the sampler waits up to the switch interval (5 ms), so unweighted counts would
            # under-represent busy Python code.
            now = time.perf_counter()
            dt, prev = now - prev, now
            if not names or time.time() - last > 5.0:
                names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                tname = names.get(tid, str(tid))
                count[tname] += dt
                leaf[(tname, _key(frame.f_code))] += dt
                seen = set()
                f = frame
                while f is not None:
                    k = _key(f.f_code)
                    if k not in seen:
                        seen.add(k)
                        incl[(tname, k)] += dt
                    f = f.f_back
            force = False
            if now >= next_check:
                next_check = now + 0.1
                for name in ("reset", "dump"):
                    try:
                        m = os.stat(os.path.join(_DIR, name)).st_mtime
                    except OSError:
                        continue
                    if name == "reset" and m > seen_reset:
                        seen_reset = m
                        incl.clear(), leaf.clear(), count.clear()
                        _gc.clear()
                        base[0] = _usage()
                    elif name == "dump" and m > seen_dump:
                        seen_dump = m
                        force = True
            if force or time.time() - last > 5.0:
                last = time.time()
                try:
                    dump(count_objects=force)
                except OSError:
                    pass

    os.makedirs(_DIR, exist_ok=True)
    threading.Thread(target=_sampler, name="replayssm-diag-sampler", daemon=True).start()
