"""Streaming host data through the GPU: multireduce.stream against its peers, in one run.

Cases (float32 sums; values ``i % 1024``, exact in float32, so the exact sum is known):

``pinned``     ``stream.reduce(h)`` of ``--gib`` GiB in pinned host memory. Target >= 50 GB/s.
               Peer: ``cupy.asarray(h).sum()``.
``pageable``   the same from ordinary NumPy memory. Target >= 25 GB/s. Peer:
               ``cupy.asarray(h).sum()`` (7-8.7 GB/s in the baselines).
``seed``       2^24 float32 from pageable memory, transfer included. Target <= 2.3 ms and at
               least 4x faster than ``np.sum(h)`` on the host CPU, measured here too; peer
               ``cupy.asarray(h).sum()``.
``dask``       a 1 GiB NumPy-chunked Dask array (16 chunks) reduced on the GPU with
               ``stream.reduce(x)``. Target >= 40 GB/s. Peers: ``x.map_blocks(cupy.asarray)
               .sum()`` and Dask's own CPU ``x.sum()`` (threaded scheduler).
``generated``  a lazily generated Dask array of at least ``--generated-factor`` (4) times the
               GPU's memory, chunks made on the GPU (``map_blocks`` with a CuPy kernel), reduced
               by ``treereduce`` with ``--generated-workers`` threads (bounded memory: the
               CuPy pool's size is reported). One timed run after a two-chunk warm-up; the rate
               is reported, Dask's own ``x.sum()`` on the same array is the peer.

``ours`` uses ``stream.COPY_ENGINE``'s default (the native copy engine where it builds);
``ours-python`` is the same call with ``COPY_ENGINE = "python"`` (the Python copy threads), in
the pageable, seed and dask cases, unless ``--no-python-engine``.

Method: wall time (``time.perf_counter``) of the whole call, transfer included, with a
device synchronization where the result stays on the GPU; cases and their peers interleaved
in each repetition; median, p10 and p90 over ``--repeat`` after ``--warmup``. GB/s = input
bytes / time (1 GB = 1e9 B). Every result is checked against the exact sum.

Writes one JSON document (git commit, GPU, every sample) and prints a table with PASS/MISS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _benchutil import exact_pattern_sum, interleaved, patched, stats  # noqa: E402

from multireduce._provenance import git_state  # noqa: E402

GIB = 1 << 30


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="size of the pinned and pageable cases")
    p.add_argument("--dask-gib", type=float, default=1.0)
    p.add_argument("--dask-chunks", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--seed-repeat", type=int, default=50)
    p.add_argument("--threads", type=int, default=None, help="stream.reduce copy threads (default: its own)")
    p.add_argument("--budget", type=int, default=1 << 30)
    p.add_argument("--slot-mib", type=int, default=None)
    p.add_argument(
        "--serial-piece-mib",
        type=float,
        default=None,
        help="stream.SERIAL_PIECE_BYTES for the dask case (default: the module's)",
    )
    p.add_argument("--generated-factor", type=float, default=4.0, help="times the GPU's memory; 0 skips")
    p.add_argument("--generated-chunk-gib", type=float, default=2.0)
    p.add_argument("--generated-workers", type=int, default=4)
    p.add_argument("--cases", default="pinned,pageable,seed,dask,generated")
    p.add_argument("--no-python-engine", action="store_true", help="skip the ours-python peer (COPY_ENGINE='python')")
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


PATTERN = ("int64 start", "float32 y", "y = (float)((start + i) % 1024);", "mr_bench_pattern")


class Bench:
    def __init__(self, args, cupy):
        self.args, self.cupy = args, cupy
        self.records: list[dict] = []
        self.checks: dict[str, dict] = {}
        self.kernel = cupy.ElementwiseKernel(*PATTERN)
        self.sync = cupy.cuda.Device().synchronize

    def host_pattern(self, n: int, out: np.ndarray | None = None) -> np.ndarray:
        y = self.cupy.empty(n, dtype=self.cupy.float32)
        self.kernel(np.int64(0), y)
        host = y.get() if out is None else out
        if out is not None:
            out[:] = y.get()
        del y
        return host

    def check(self, case: str, name: str, value, exact: int) -> None:
        got = float(value)
        self.checks.setdefault(case, {})[name] = {
            "value": got,
            "exact": exact,
            "relative_error": abs(got - exact) / exact if exact else abs(got),
            "exact_after_float32_rounding": got == float(np.float32(exact)),
        }

    def record(self, case: str, samples: dict[str, list[float]], nbytes: int, targets: dict) -> None:
        for name, s in samples.items():
            st = stats(s)
            rec = {"case": case, "peer": name, "bytes": nbytes, "GBps": nbytes / (st["median_ms"] / 1e3) / 1e9}
            rec.update(st)
            rec["samples_ms"] = [v * 1e3 for v in s]
            for key, (kind, bound) in targets.get(name, {}).items():
                value = rec[key]
                rec.setdefault("targets", []).append(
                    {
                        "metric": key,
                        "kind": kind,
                        "bound": bound,
                        "value": value,
                        "pass": value >= bound if kind == ">=" else value <= bound,
                    }
                )
            self.records.append(rec)


def python_engine(stream, fn):
    """``fn`` run with the Python copy threads (``stream.COPY_ENGINE = "python"``)."""

    def call():
        with patched(stream, COPY_ENGINE="python"):
            return fn()

    return call


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy

    from multireduce import stream

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    free0, total_mem = cupy.cuda.runtime.memGetInfo()
    b = Bench(args, cupy)
    kw = {"budget": args.budget, "threads": args.threads}
    if args.slot_mib:
        kw["slot_bytes"] = args.slot_mib << 20
    cases = args.cases.split(",")
    if args.serial_piece_mib:
        stream.SERIAL_PIECE_BYTES = int(args.serial_piece_mib * (1 << 20))
    extra: dict = {
        "threads_default": stream.make_plan(GIB, 4).threads,
        "cpus": os.cpu_count(),
        "pieces_per_thread": stream.PIECES_PER_THREAD,
        "serial_piece_bytes": stream.SERIAL_PIECE_BYTES,
        "copy_engine": stream.copy_engine(),
        "native_piece_bytes": stream.NATIVE_PIECE_BYTES,
        "native_streaming_stores": stream.NATIVE_STREAMING_STORES,
    }

    def with_python(peers: dict, case: str, exact: int) -> dict:
        if args.no_python_engine:
            return peers
        fn = python_engine(stream, peers["ours"])
        b.check(case, "ours-python", fn(), exact)
        return {**peers, "ours-python": fn}

    if "pinned" in cases:
        n = int(args.gib * GIB) // 4
        mem = cupy.cuda.alloc_pinned_memory(n * 4)
        h = np.frombuffer(mem, dtype=np.float32, count=n)
        b.host_pattern(n, out=h)
        exact = exact_pattern_sum(0, n)
        b.check("pinned", "ours", stream.reduce(h, "sum", **kw), exact)
        b.check("pinned", "cupy.asarray+sum", cupy.asarray(h).sum(), exact)
        s = interleaved(
            {"ours": lambda: stream.reduce(h, "sum", **kw), "cupy.asarray+sum": lambda: cupy.asarray(h).sum()},
            args.warmup,
            args.repeat,
            b.sync,
        )
        b.record("pinned", s, n * 4, {"ours": {"GBps": (">=", 50.0)}})
        del h, mem

    if "pageable" in cases:
        n = int(args.gib * GIB) // 4
        h = b.host_pattern(n)
        exact = exact_pattern_sum(0, n)
        b.check("pageable", "ours", stream.reduce(h, "sum", **kw), exact)
        b.check("pageable", "cupy.asarray+sum", cupy.asarray(h).sum(), exact)
        peers = {"ours": lambda: stream.reduce(h, "sum", **kw), "cupy.asarray+sum": lambda: cupy.asarray(h).sum()}
        s = interleaved(
            with_python(peers, "pageable", exact),
            args.warmup,
            args.repeat,
            b.sync,
        )
        b.record("pageable", s, n * 4, {"ours": {"GBps": (">=", 25.0)}})
        del h

    if "seed" in cases:
        n = 1 << 24
        h = b.host_pattern(n)
        exact = exact_pattern_sum(0, n)
        b.check("seed", "ours", stream.reduce(h, "sum", **kw), exact)
        b.check("seed", "numpy", np.sum(h), exact)
        peers = {
            "ours": lambda: stream.reduce(h, "sum", **kw),
            "numpy": lambda: np.sum(h),
            "cupy.asarray+sum": lambda: cupy.asarray(h).sum(),
        }
        s = interleaved(
            with_python(peers, "seed", exact),
            args.warmup * 3,
            args.seed_repeat,
            b.sync,
        )
        numpy_ms = statistics.median(s["numpy"]) * 1e3
        b.record("seed", s, n * 4, {"ours": {"median_ms": ("<=", 2.3)}})
        ours_ms = statistics.median(s["ours"]) * 1e3
        extra["seed_speedup_vs_numpy"] = numpy_ms / ours_ms
        ours_record = next(r for r in b.records if r["case"] == "seed" and r["peer"] == "ours")
        ours_record["targets"].append(
            {
                "metric": "speedup_vs_numpy",
                "kind": ">=",
                "bound": 4.0,
                "value": numpy_ms / ours_ms,
                "pass": numpy_ms / ours_ms >= 4.0,
            }
        )
        del h

    if "dask" in cases:
        import dask
        import dask.array as da

        n = int(args.dask_gib * GIB) // 4
        n -= n % args.dask_chunks
        h = b.host_pattern(n)
        exact = exact_pattern_sum(0, n)
        x = da.from_array(h, chunks=n // args.dask_chunks)
        with dask.config.set(scheduler="threads"):
            peers = {
                "ours": lambda: stream.reduce(x, "sum", **kw),
                "dask+cupy.asarray": lambda: x.map_blocks(cupy.asarray).sum().compute(),
                "dask-cpu": lambda: x.sum().compute(),
            }
            for name, fn in peers.items():
                b.check("dask", name, fn(), exact)
            s = interleaved(with_python(peers, "dask", exact), args.warmup, args.repeat, b.sync)
        b.record("dask", s, n * 4, {"ours": {"GBps": (">=", 40.0)}})
        del x, h

    if "generated" in cases and args.generated_factor > 0:
        extra["generated"] = generated_case(args, b, cupy, total_mem)

    stream.free_staging()
    passed = all(t["pass"] for r in b.records for t in r.get("targets", []))
    correct = all(
        v["exact_after_float32_rounding"] for c in b.checks.values() for k, v in c.items() if k.startswith("ours")
    )
    doc = {
        "benchmark": "bench_stream",
        "git": git_state(),
        "gpu": gpu,
        "gpu_memory_bytes": total_mem,
        "gpu_free_bytes_at_start": free0,
        "python": platform.python_version(),
        "versions": {"cupy": cupy.__version__, "numpy": np.__version__},
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "timing": "perf_counter around the whole call (+ device synchronize); cases interleaved per repetition",
        "checks": b.checks,
        "ours_correct": correct,
        "all_targets_pass": passed,
        "extra": extra,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "records": b.records,
    }
    out = args.output or REPO / "bench" / "results" / f"bench_stream_{gpu.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")

    threads = extra["threads_default"] if args.threads is None else args.threads
    print(f"bench_stream: {gpu}, budget {args.budget / GIB:.2f} GiB, copy threads {threads}")
    print(f"copy engine: {extra['copy_engine']}")
    print(f"multireduce from {Path(sys.modules['multireduce'].__file__).parent}")  # the checkout measured
    print(f"{'case':<10} {'peer':<20} {'median ms':>10} {'p10':>9} {'p90':>9} {'GB/s':>8}  targets")
    for r in b.records:
        verdicts = "; ".join(
            f"{t['metric']} {t['kind']} {t['bound']} ({t['value']:.3g}) {'PASS' if t['pass'] else 'MISS'}"
            for t in r.get("targets", [])
        )
        times = f"{r['median_ms']:>10.3f} {r['p10_ms']:>9.3f} {r['p90_ms']:>9.3f}"
        print(f"{r['case']:<10} {r['peer']:<20} {times} {r['GBps']:>8.1f}  {verdicts}")
    if "generated" in extra:
        g = extra["generated"]
        print(
            f"generated: {g['bytes'] / 1e9:.0f} GB ({g['times_device_memory']:.2f}x device memory) "
            f"in {g['ours_s']:.2f} s = {g['ours_GBps']:.0f} GB/s (dask x.sum(): {g['dask_s']:.2f} s); "
            f"CuPy pool peak {g['pool_total_bytes'] / GIB:.1f} GiB; exact: {g['ours_exact']}"
        )
    print(f"all 'ours' results exact: {correct}; all targets pass: {passed}")
    print(f"wrote {out}")
    return 0 if correct else 1


def generated_case(args, b: Bench, cupy, total_mem: int) -> dict:
    import dask
    import dask.array as da

    import multireduce.dask  # noqa: F401

    chunk = int(args.generated_chunk_gib * GIB) // 4
    n_chunks = -(-int(args.generated_factor * total_mem) // (chunk * 4))
    n = chunk * n_chunks
    kernel = b.kernel

    def make(block_info=None):
        loc = block_info[None]["array-location"][0]
        y = cupy.empty(loc[1] - loc[0], dtype=cupy.float32)
        kernel(np.int64(loc[0]), y)
        return y

    def generated(count):
        return da.map_blocks(make, chunks=((chunk,) * count,), dtype=np.float32, meta=cupy.empty(0, cupy.float32))

    x = generated(n_chunks)
    exact = exact_pattern_sum(0, n)
    pool = cupy.get_default_memory_pool()
    with dask.config.set(scheduler="threads", num_workers=args.generated_workers):
        # Warm-up on two chunks of the same size: kernel compiles (ours, CuPy's, the generator)
        # stay out of the timed runs.
        warm = generated(2)
        warm.treereduce("sum").compute()
        warm.sum().compute()
        b.sync()
        pool.free_all_blocks()
        b.sync()
        t = time.perf_counter()
        ours = x.treereduce("sum").compute()
        b.sync()
        ours_s = time.perf_counter() - t
        peak = pool.total_bytes()
        t = time.perf_counter()
        theirs = x.sum().compute()
        b.sync()
        dask_s = time.perf_counter() - t
    b.check("generated", "ours", ours, exact)
    b.check("generated", "dask", theirs, exact)
    return {
        "bytes": n * 4,
        "chunks": n_chunks,
        "chunk_bytes": chunk * 4,
        "times_device_memory": n * 4 / total_mem,
        "workers": args.generated_workers,
        "ours_s": ours_s,
        "ours_GBps": n * 4 / ours_s / 1e9,
        "dask_s": dask_s,
        "dask_GBps": n * 4 / dask_s / 1e9,
        "pool_total_bytes": peak,
        "ours_exact": b.checks["generated"]["ours"]["exact_after_float32_rounding"],
    }


if __name__ == "__main__":
    sys.exit(main())
