"""Dask on one GPU: multireduce.dask.treereduce against Dask's own ``x.sum()``, in one run.

Cases, on one CuPy-backed Dask array (default 4 GiB of float32 in 16 chunks, made on the GPU
with exact integer values ``i % 1024`` so that the exact sum is known), threaded scheduler:

``ours``            ``x.treereduce("sum").compute()`` (graph built and computed each call)
``ours-se16``       the same with ``split_every=16`` (one aggregate, no combine level; the
                    default for full reductions of up to 64 chunks)
``ours-se4``        the same with ``split_every=4`` (Dask's default: a combine level)
``ours-prebuilt``   ``compute()`` of a graph built once
``dask``            ``x.sum().compute()``
``dask-se16``       ``x.sum(split_every=16).compute()``
``ours-4threads``   ``ours`` with ``compute(num_workers=4)`` (the threaded scheduler's pool is
                    the host's CPU count by default; a diagnostic of thread contention)
``ours-sync``       ``ours`` with ``scheduler="sync"`` (no thread hand-offs; a diagnostic)
``ours-nofuse``     ``ours`` under ``dask.config.set({"optimization.fuse.active": False})``
``dask-nofuse``     ``dask`` likewise (diagnostics: Dask's linear fusion joins each getter to its
                    chunk task, and runs every fused task as a subgraph with its own
                    ``dask.order`` call)

With ``--cuda-cluster`` also, on ``dask_cuda.LocalCUDACluster`` (one worker per GPU) with the
chunks persisted in the worker's GPU memory: ``cluster-ours`` and ``cluster-dask``.

Method: wall time of the call plus a device synchronization (the result is a 0-d CuPy array
left on the device), with the cases interleaved in each repetition so that drift hits all of
them alike; median, p10 and p90 over ``--repeat`` repetitions after ``--warmup``. GB/s =
bytes of the array / time (1 GB = 1e9 B). Target: ``ours`` at most 5 ms.

Writes one JSON document (git commit, GPU, versions, every sample) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _benchutil import exact_pattern_sum, interleaved, stats  # noqa: E402

from multireduce._provenance import git_state  # noqa: E402

TARGET_OURS_MS = 5.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="array size in GiB of float32")
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--cuda-cluster", action="store_true", help="also time on dask_cuda.LocalCUDACluster")
    p.add_argument("--cluster-chunks", type=int, default=8)
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def generator(cupy):
    # Exact float32 values i % 1024, made on the GPU in one pass.
    return cupy.ElementwiseKernel("int64 start", "float32 y", "y = (float)((start + i) % 1024);", "mr_bench_pattern")


def no_fusion(call):
    """``call`` with Dask's low-level (linear) fusion switched off for its compute."""
    import dask

    def run():
        with dask.config.set({"optimization.fuse.active": False}):
            return call()

    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy
    import dask
    import dask.array as da

    import multireduce.dask  # noqa: F401  registers x.treereduce

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    n = int(args.gib * (1 << 30)) // 4
    n -= n % args.chunks
    x = cupy.empty(n, dtype=cupy.float32)
    generator(cupy)(np.int64(0), x)
    exact = exact_pattern_sum(0, n)
    d = da.from_array(x, chunks=n // args.chunks, asarray=False)
    prebuilt = d.treereduce("sum")
    sync = dev.synchronize

    with dask.config.set(scheduler="threads"):
        checks = {
            "ours": float(d.treereduce("sum").compute()),
            "dask": float(d.sum().compute()),
        }
        cases = {
            "ours": lambda: d.treereduce("sum").compute(),
            "ours-se16": lambda: d.treereduce("sum", split_every=16).compute(),
            "ours-se4": lambda: d.treereduce("sum", split_every=4).compute(),
            "ours-prebuilt": lambda: prebuilt.compute(),
            "dask": lambda: d.sum().compute(),
            "dask-se16": lambda: d.sum(split_every=16).compute(),
            "ours-4threads": lambda: d.treereduce("sum").compute(num_workers=4),
            "ours-sync": lambda: d.treereduce("sum").compute(scheduler="sync"),
            "ours-nofuse": no_fusion(lambda: d.treereduce("sum").compute()),
            "dask-nofuse": no_fusion(lambda: d.sum().compute()),
        }
        samples = interleaved(cases, args.warmup, args.repeat, sync)

    errors = {}
    if args.cuda_cluster:
        try:
            samples.update(cluster_cases(args, cupy, da, checks))
        except Exception as exc:  # recorded, printed and turned into a non-zero exit below
            errors["cuda-cluster"] = "".join(traceback.format_exception(exc))

    nbytes = n * 4
    records = []
    for name, s in samples.items():
        st = stats(s)
        rec = {
            "case": name,
            "n": n,
            "dtype": "float32",
            "chunks": args.cluster_chunks if name.startswith("cluster-") else args.chunks,
            "GBps": nbytes / (st["median_ms"] / 1e3) / 1e9,
        }
        rec.update(st)
        rec["samples_ms"] = [v * 1e3 for v in s]
        if name == "ours":
            rec["target_ms"] = TARGET_OURS_MS
            rec["pass"] = st["median_ms"] <= TARGET_OURS_MS
        records.append(rec)
    correct = checks["ours"] == float(np.float32(exact))
    if "cluster-ours" in checks:  # its own length (a multiple of --cluster-chunks), its own exact sum
        correct = correct and checks["cluster-ours"] == float(np.float32(checks["cluster-exact"]))
    doc = {
        "benchmark": "bench_dask",
        "git": git_state(),
        "gpu": gpu,
        "python": platform.python_version(),
        "versions": {"dask": dask.__version__, "cupy": cupy.__version__, "numpy": np.__version__},
        "scheduler": "threads",
        "warmup": args.warmup,
        "repeat": args.repeat,
        "timing": "perf_counter around call + device synchronize; cases interleaved per repetition",
        "exact_sum": exact,
        "results": {k: v for k, v in checks.items()},
        "ours_correct": correct,
        "dask_relative_error": abs(checks["dask"] - exact) / exact,
        "errors": errors,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "records": records,
    }
    out = args.output or REPO / "bench" / "results" / f"bench_dask_{gpu.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")

    print(f"bench_dask: {gpu}, {nbytes / 2**30:.2f} GiB float32 in {args.chunks} chunks, dask {dask.__version__}")
    print(f"{'case':<16} {'median ms':>10} {'p10':>8} {'p90':>8} {'GB/s':>8}  target")
    for r in records:
        verdict = ""
        if "target_ms" in r:
            verdict = f"<= {r['target_ms']} ms  {'PASS' if r['pass'] else 'MISS'}"
        times = f"{r['median_ms']:>10.3f} {r['p10_ms']:>8.3f} {r['p90_ms']:>8.3f}"
        print(f"{r['case']:<16} {times} {r['GBps']:>8.1f}  {verdict}")
    rel = doc["dask_relative_error"]
    print(f"ours correct (== exact sum rounded to float32, cluster too): {correct}; dask relative error {rel:.2e}")
    for k, v in errors.items():
        print(f"ERROR in {k}:\n{v}")
    print(f"wrote {out}")
    return 0 if correct and not errors else 1


def cluster_cases(args, cupy, da, checks) -> dict[str, list[float]]:
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    n = int(args.gib * (1 << 30)) // 4
    n -= n % args.cluster_chunks
    size = n // args.cluster_chunks

    def make(block_info=None):
        import cupy as cp
        import numpy as np_

        start = block_info[None]["array-location"][0][0]
        y = cp.empty(block_info[None]["chunk-shape"][0], dtype=cp.float32)
        kernel = cp.ElementwiseKernel(
            "int64 start", "float32 y", "y = (float)((start + i) % 1024);", "mr_bench_pattern"
        )
        kernel(np_.int64(start), y)
        return y

    with LocalCUDACluster(dashboard_address=":0") as cluster, Client(cluster) as client:
        d = da.map_blocks(
            make, chunks=((size,) * args.cluster_chunks,), dtype=np.float32, meta=cupy.empty(0, cupy.float32)
        )
        d = client.persist(d)
        wait(d)

        def ours():
            return client.compute(d.treereduce("sum")).result()

        def theirs():
            return client.compute(d.sum()).result()

        checks["cluster-exact"] = exact_pattern_sum(0, n)
        checks["cluster-ours"] = float(ours())
        checks["cluster-dask"] = float(theirs())
        return {
            f"cluster-{k}": v
            for k, v in interleaved({"ours": ours, "dask": theirs}, args.warmup, args.repeat, lambda: None).items()
        }


if __name__ == "__main__":
    sys.exit(main())
