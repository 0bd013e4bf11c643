"""Where Dask's time goes in one ``treereduce("sum").compute()`` on one GPU: graph variants.

The array is the one of ``scripts/bench_dask.py`` (default 4 GiB of float32 in 16 chunks, made
on the GPU; ``--cpu`` uses NumPy chunks instead, to try the script without a GPU). Every case
computes the same sum; they are interleaved round after round (``_benchutil.interleaved``):

``ours``              ``x.treereduce("sum").compute()``: build and compute (the target case)
``prebuilt``          ``compute()`` of a graph built once (threaded scheduler)
``prebuilt-sync``     the same under the synchronous scheduler
``prebuilt-nofuse``   with ``optimization.fuse.active=False`` (no low-level linear fusion)
``prebuilt-noopt``    with ``optimize_graph=False`` (no optimization at all)
``prebuilt-wN``       ``num_workers=N`` threads
``prebuilt-swi``      with ``sys.setswitchinterval(0.0005)`` (the GIL's hand-off interval)
``delayed-one``       a hand-made graph of the 16 blocks and one task that reduces them all
``dask``              Dask's own ``x.sum().compute()``

and, outside Dask, ``chunk-host``: the host time of the 16 chunk steps called by hand (no
synchronization inside, so on the GPU this is Python and kernel launches only).

``--profile`` adds a cProfile of 100 computes each of ``prebuilt``, ``prebuilt-sync`` (all
of the work in the calling thread) and ``prebuilt-noopt``, by cumulative time. (This replaces
``scripts/profile_dask.py``, whose output some earlier result folders hold.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _benchutil import interleaved, stats  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--cpu", action="store_true", help="NumPy chunks (no GPU needed)")
    p.add_argument("--profile", action="store_true", help="also profile prebuilt, prebuilt-sync and prebuilt-noopt")
    args = p.parse_args(argv)

    import dask
    import dask.array as da
    from dask.delayed import delayed

    import multireduce.dask  # noqa: F401  registers x.treereduce
    from multireduce import dask as mrdask
    from multireduce.ops import get_op

    if args.cpu:
        xp = np
        sync = lambda: None  # noqa: E731
    else:
        import cupy as xp

        sync = xp.cuda.Device().synchronize
    n = int(args.gib * (1 << 30)) // 4
    n -= n % args.chunks
    x = xp.arange(n, dtype=xp.float32) % 1024
    d = da.from_array(x, chunks=n // args.chunks, asarray=False)
    prebuilt = d.treereduce("sum")
    op = get_op("sum")

    def reduce_all(blocks):
        return multireduce.sum(xp.stack([multireduce.sum(b, dtype=np.float64) for b in blocks]))

    one = delayed(reduce_all)(list(d.to_delayed().ravel()))

    def with_config(fn, **cfg):
        def run():
            with dask.config.set(cfg):
                return fn()

        return run

    def with_switch(fn, interval):
        def run():
            old = sys.getswitchinterval()
            sys.setswitchinterval(interval)
            try:
                return fn()
            finally:
                sys.setswitchinterval(old)

        return run

    cases = {
        "ours": lambda: d.treereduce("sum").compute(),
        "prebuilt": lambda: prebuilt.compute(),
        "prebuilt-sync": lambda: prebuilt.compute(scheduler="sync"),
        "prebuilt-nofuse": with_config(lambda: prebuilt.compute(), **{"optimization.fuse.active": False}),
        "prebuilt-noopt": lambda: prebuilt.compute(optimize_graph=False),
        "prebuilt-w1": lambda: prebuilt.compute(num_workers=1),
        "prebuilt-w2": lambda: prebuilt.compute(num_workers=2),
        "prebuilt-w4": lambda: prebuilt.compute(num_workers=4),
        "prebuilt-swi": with_switch(lambda: prebuilt.compute(), 0.0005),
        "delayed-one": lambda: one.compute(),
        "dask": lambda: d.sum().compute(),
    }
    want = float(x.sum(dtype=xp.float64))
    for name, fn in cases.items():
        got = float(fn())
        if abs(got - want) > 1e-6 * abs(want):  # float32 results: rounded once
            raise SystemExit(f"{name}: {got} != {want}")
    blocks = [x[i * (n // args.chunks) : (i + 1) * (n // args.chunks)] for i in range(args.chunks)]

    def chunk_host():
        t = time.perf_counter()
        for b in blocks:
            mrdask._chunk(b, (0,), True, op=op, dtype=None, expected=b.dtype)
        return time.perf_counter() - t

    host = []
    for _ in range(args.repeat + 5):
        sync()
        host.append(chunk_host())
        sync()
    samples = interleaved(cases, 5, args.repeat, sync)
    where = "NumPy (CPU)" if args.cpu else "GPU"
    print(f"diag_dask: {args.gib:.2f} GiB float32 in {args.chunks} chunks on {where}, dask {dask.__version__}")
    print(f"{'case':<18} {'median ms':>10} {'p10':>8} {'p90':>8}")
    for name, s in samples.items():
        st = stats(s)
        print(f"{name:<18} {st['median_ms']:10.3f} {st['p10_ms']:8.3f} {st['p90_ms']:8.3f}")
    st = stats(host[5:])
    print(f"{'chunk-host':<18} {st['median_ms']:10.3f} {st['p10_ms']:8.3f} {st['p90_ms']:8.3f}")
    if args.profile:
        for name in ("prebuilt", "prebuilt-sync", "prebuilt-noopt"):
            profile(name, cases[name], sync)
    return 0


def profile(name, fn, sync, calls=100) -> None:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
        sync()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
    print(f"--- cProfile: {calls} x {name}, by cumulative time")
    print(text.getvalue())


if __name__ == "__main__":
    sys.exit(main())
