"""The multi-GPU run (issue 8): weak and strong scaling of sum, max, min, the reproducible sum
and the fused stats under MPI, one rank per GPU, each result checked against one GPU's.

The driver launches ``mpiexec -n R`` for each ``--ranks`` count (one process group, killed
after ``--timeout``). Each rank generates its shard of a global float32 array on its own GPU,
element ``i`` a function of ``i`` alone (a hash of the index: random signs, exponents over 2^-24
to 2^8, random mantissas), so that the global array is the same at every rank count and the
sums cancel heavily. Per configuration (global ``n``) and op it times, with ``Barrier`` and a
stream synchronization around each call, the maximum over ranks and the median of ``--repeat``
calls (local and total interleaved):

* ``local``: the rank's own reduction (``core.partial``, or ``core.partial(..., "mean")`` for
  stats, whose state comes to the host);
* ``total``: the distributed call (``multireduce.mpi.allreduce`` or ``multireduce.mpi.stats``);
* ``combine = total - local``, what the MPI layer adds.

Configurations: weak (``--weak-per-rank`` elements per rank, 4 GiB of float32 by default) and
strong (``--strong-n`` in total, 16 GiB by default). The one-rank launch also reduces every
global size that a larger rank count uses, as the reference of the correctness check:

* reproducible sums, max and min: the same bits as one GPU;
* the fast float32 sum: within one float32 ulp of the reproducible (correctly rounded) sum, or
  the float64 accumulation bound;
* stats: count, min and max equal, sum, mean and variance within 1e-9 relative.

Weak efficiency is ``total(1 rank) / total(R ranks)`` of the weak configuration.

Run on a machine with R GPUs: ``python scripts/bench_multigpu.py --ranks 1,2``. Writes one
JSON file (``--output``; default ``bench/results/multigpu_<gpus>x<model>_<commit>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _mpiexec  # noqa: E402

from multireduce._provenance import git_state  # noqa: E402

OPS = ("sum", "max", "min", "sum_reproducible", "stats")
STATS_FIELDS = ("count", "nan_count", "sum", "min", "max", "mean", "var", "std")

_GENERATE = r"""
unsigned long long z = (unsigned long long)(base + i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
z ^= z >> 31;
unsigned int e = 127u - 24u + (unsigned int)((z >> 32) % 33ull);
y = __uint_as_float(((unsigned int)(z >> 63) << 31) | (e << 23) | (unsigned int)(z & 0x7FFFFFull));
"""


def _int_list(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=_int_list, default=[1, 2])
    p.add_argument("--weak-per-rank", type=int, default=2**30, help="float32 elements per rank (weak)")
    p.add_argument("--strong-n", type=int, default=2**32, help="float32 elements in total (strong)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--timeout", type=float, default=420.0, help="seconds per mpiexec launch")
    p.add_argument(
        "--per-device", type=int, default=0, help="also time devices 1..N-1 alone (one rank each) at the weak size"
    )
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--cpu", action="store_true", help="NumPy shards on the CPU (tests the script without a GPU)")
    p.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=_int_list, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------
# Worker: one mpiexec launch


def _bits(value) -> str:
    arr = np.asarray(value)
    return arr.reshape(1).view(f"u{arr.dtype.itemsize}")[0].item().to_bytes(arr.dtype.itemsize, "big").hex()


def generate_host(base: int, n: int) -> np.ndarray:
    """Elements ``base .. base + n - 1`` of the global array, on the host: the same bits as
    the GPU generator (``_GENERATE``), in NumPy's wrapping uint64 arithmetic."""
    z = np.arange(base, base + n, dtype=np.uint64)
    z = z * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    e = np.uint64(127 - 24) + (z >> np.uint64(32)) % np.uint64(33)
    bits = ((z >> np.uint64(63)) << np.uint64(31)) | (e << np.uint64(23)) | (z & np.uint64(0x7FFFFF))
    return bits.astype(np.uint32).view(np.float32)


class _Host:
    """The CPU stand-in for the GPU pieces of the worker (``--cpu``)."""

    def __init__(self):
        self.device = None

    def synchronize(self):
        pass

    def shard(self, begin: int, end: int) -> np.ndarray:
        return generate_host(begin, end - begin)

    def free(self):
        pass

    def describe(self) -> tuple[str, int]:
        return "cpu", 0


class _Gpu:
    def __init__(self, mpi, comm):
        import cupy

        self.cupy = cupy
        self.device = mpi.select_device(comm)
        self.generate = cupy.ElementwiseKernel("int64 base", "float32 y", _GENERATE, "multireduce_bench_generate")
        self.stream = cupy.cuda.get_current_stream()

    def synchronize(self):
        self.stream.synchronize()

    def shard(self, begin: int, end: int):
        x = self.cupy.empty(end - begin, dtype=np.float32)
        step = 1 << 28
        for s in range(0, x.size, step):
            self.generate(np.int64(begin + s), x[s : s + step])
        self.stream.synchronize()
        return x

    def free(self):
        self.cupy.get_default_memory_pool().free_all_blocks()

    def describe(self) -> tuple[str, int]:
        runtime = self.cupy.cuda.runtime
        name = runtime.getDeviceProperties(self.device)["name"]
        return (name.decode() if isinstance(name, bytes) else str(name)), runtime.getDeviceCount()


def _host_values(value) -> np.ndarray:
    return value.get() if hasattr(value, "get") else np.asarray(value)


def worker(args) -> int:
    from multireduce import core, mpi
    from multireduce.mpi import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    backend = _Host() if args.cpu else _Gpu(mpi, comm)
    ops = args.ops.split(",")

    def timed(fn, x) -> list[float]:
        """One call's seconds on every rank (rank order)."""
        comm.Barrier()
        backend.synchronize()
        start = MPI.Wtime()
        fn(x)
        backend.synchronize()
        return comm.allgather(MPI.Wtime() - start)

    calls = {
        "sum": (lambda x: core.partial(x, "sum"), lambda x: mpi.allreduce(x, "sum")),
        "max": (lambda x: core.partial(x, "max"), lambda x: mpi.allreduce(x, "max")),
        "min": (lambda x: core.partial(x, "min"), lambda x: mpi.allreduce(x, "min")),
        "sum_reproducible": (
            lambda x: core.partial(x, "sum", reproducible=True),
            lambda x: mpi.allreduce(x, "sum", reproducible=True),
        ),
        "stats": (lambda x: core.partial(x, "mean"), lambda x: mpi.stats(x)),
    }
    records = []
    for n in args.sizes:
        begin, end = mpi.shard_range(n, rank, size)
        x = backend.shard(begin, end)
        for op in ops:
            local_fn, total_fn = calls[op]
            for _ in range(args.warmup):
                local_fn(x)
                result = total_fn(x)
            local_runs, total_runs = [], []
            for _ in range(args.repeat):  # interleaved, so that drift hits both alike
                local_runs.append(timed(local_fn, x))
                total_runs.append(timed(total_fn, x))
            local = statistics.median(max(run) for run in local_runs)
            total = statistics.median(max(run) for run in total_runs)
            result = total_fn(x)
            if op == "stats":
                value = {f: float(_host_values(getattr(result, f))) for f in STATS_FIELDS}
                bits = {f: _bits(_host_values(getattr(result, f))) for f in STATS_FIELDS}
            else:
                host = _host_values(result)
                value, bits = float(host), _bits(host)
            records.append(
                {
                    "ranks": size,
                    "n": n,
                    "bytes": 4 * n,
                    "op": op,
                    "local_s": local,
                    "total_s": total,
                    "combine_s": total - local,
                    "local_s_min": min(max(run) for run in local_runs),
                    "total_s_min": min(max(run) for run in total_runs),
                    "local_s_per_rank": [statistics.median(run[r] for run in local_runs) for r in range(size)],
                    "total_s_per_rank": [statistics.median(run[r] for run in total_runs) for r in range(size)],
                    "value": value,
                    "bits": bits,
                }
            )
            if rank == 0:
                print(
                    f"ranks {size} n 2^{np.log2(n):.2f} {op:17s} local {local * 1e6:9.1f} us  "
                    f"total {total * 1e6:9.1f} us  combine {(total - local) * 1e6:7.1f} us",
                    flush=True,
                )
        del x
        backend.free()
    devices = comm.gather(backend.device, root=0)
    if rank == 0:
        gpu, visible = backend.describe()
        aware = mpi.cuda_aware()
        doc = {
            "gpu": gpu,
            "gpus_visible": visible,
            "devices": devices,
            "mpi_library": " ".join(MPI.Get_library_version().replace("\0", " ").strip().splitlines()[0].split()),
            "cuda_aware": aware.enabled,
            "cuda_aware_decided_by": aware.method,
            "transport": mpi.transport_counts(),
            "records": records,
        }
        args.worker.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


# ------------------------------------------------------------------------------------------
# Driver


def _check(rec: dict, ref: dict) -> tuple[bool, str]:
    op = rec["op"]
    if op in ("sum_reproducible", "max", "min"):
        return rec["bits"] == ref["bits"], "bits equal"
    if op == "sum":
        exact = ref["value"]  # the one-GPU reproducible sum of the same n (correctly rounded)
        ulp = float(np.spacing(np.float32(abs(exact))))
        bound = rec["n"] * 2.0**8 * 2.0**-53 * 2  # n * max|x| * eps(float64), twice
        err = abs(rec["value"] - exact)
        return err <= max(ulp, bound), f"|fast - exact| = {err:.3g} <= max(ulp {ulp:.3g}, bound {bound:.3g})"
    ok = all(rec["value"][f] == ref["value"][f] for f in ("count", "nan_count", "min", "max"))
    worst = 0.0
    for f in ("sum", "mean", "var"):
        a, b = rec["value"][f], ref["value"][f]
        worst = max(worst, abs(a - b) / max(abs(b), 1e-300))
    return ok and worst <= 1e-9, f"count/min/max equal: {ok}; sum/mean/var max rel diff {worst:.3g}"


def driver(args) -> int:
    mpiexec = _mpiexec.find_mpiexec()
    if mpiexec is None:
        print("bench_multigpu: no mpiexec found (set MULTIREDUCE_MPIEXEC)", file=sys.stderr)
        return 2
    weak = {r: r * args.weak_per_rank for r in args.ranks}
    strong = args.strong_n
    env = _mpiexec.repo_env(REPO)
    launches = []
    docs = {}
    per_device = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in args.ranks:
            sizes = sorted({weak[r], strong} | ({weak[q] for q in args.ranks} if r == 1 else set()))
            out = Path(tmp) / f"r{r}.json"
            cmd = _mpiexec.command(
                mpiexec,
                r,
                [
                    str(Path(__file__).resolve()),
                    "--worker",
                    str(out),
                    "--sizes",
                    ",".join(map(str, sizes)),
                    "--ops",
                    args.ops,
                    "--warmup",
                    str(args.warmup),
                    "--repeat",
                    str(args.repeat),
                    *(["--cpu"] if args.cpu else []),
                ],
            )
            t0 = time.time()
            rc, stdout, stderr = _mpiexec.run_group(cmd, cwd=REPO, env=env, timeout=args.timeout)
            print(stdout, end="", flush=True)
            if rc != 0:
                print(stderr, file=sys.stderr)
                print(f"bench_multigpu: {' '.join(cmd)} exited {rc}", file=sys.stderr)
                return 1
            docs[r] = json.loads(out.read_text())
            launches.append({"ranks": r, "sizes": sizes, "seconds": time.time() - t0})
        # Each other GPU alone, at the weak size: how much the GPUs differ by themselves.
        for d in range(1, 0 if args.cpu else args.per_device):
            out = Path(tmp) / f"device{d}.json"
            cmd = _mpiexec.command(
                mpiexec,
                1,
                [str(Path(__file__).resolve()), "--worker", str(out), "--sizes", str(args.weak_per_rank)]
                + ["--ops", "sum,max", "--warmup", str(args.warmup), "--repeat", str(args.repeat)],
            )
            rc, stdout, stderr = _mpiexec.run_group(
                cmd, cwd=REPO, env={**env, "MULTIREDUCE_DEVICE": str(d)}, timeout=args.timeout
            )
            print(stdout, end="", flush=True)
            if rc != 0:
                print(stderr, file=sys.stderr)
                return 1
            per_device.append(json.loads(out.read_text()))
    elapsed = time.time() - started

    ref = {(rec["n"], rec["op"]): rec for rec in docs[1]["records"]} if 1 in docs else {}
    repro = {n: rec for (n, op), rec in ref.items() if op == "sum_reproducible"}
    records = []
    for r in args.ranks:
        for rec in docs[r]["records"]:
            rec = dict(rec)
            rec["config"] = [c for c, n in (("weak", weak[r]), ("strong", strong)) if n == rec["n"]] or ["reference"]
            base = repro.get(rec["n"]) if rec["op"] == "sum" else ref.get((rec["n"], rec["op"]))
            if base is not None and not (r == 1 and rec["op"] != "sum"):
                rec["check_passed"], rec["check_how"] = _check(rec, base)
            records.append(rec)

    summary = []
    for op in args.ops.split(","):
        t1 = next((x for x in records if x["ranks"] == 1 and x["n"] == weak[1] and x["op"] == op), None)
        s1 = next((x for x in records if x["ranks"] == 1 and x["n"] == strong and x["op"] == op), None)
        for r in args.ranks:
            w = next(x for x in records if x["ranks"] == r and x["n"] == weak[r] and x["op"] == op)
            s = next(x for x in records if x["ranks"] == r and x["n"] == strong and x["op"] == op)
            summary.append(
                {
                    "op": op,
                    "ranks": r,
                    "weak_total_us": w["total_s"] * 1e6,
                    "weak_combine_us": w["combine_s"] * 1e6,
                    "weak_efficiency": t1["total_s"] / w["total_s"] if t1 else None,
                    "strong_total_us": s["total_s"] * 1e6,
                    "strong_combine_us": s["combine_s"] * 1e6,
                    "strong_speedup": s1["total_s"] / s["total_s"] if s1 else None,
                    "strong_efficiency": s1["total_s"] / (r * s["total_s"]) if s1 else None,
                }
            )
    failed = [x for x in records if x.get("check_passed") is False]
    first = docs[args.ranks[0]]
    git = git_state()
    doc = {
        "benchmark": "bench_multigpu",
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "gpu": first["gpu"],
        "gpus_visible": first["gpus_visible"],
        "devices_per_launch": {str(r): docs[r]["devices"] for r in args.ranks},
        "mpi_library": first["mpi_library"],
        "cuda_aware": first["cuda_aware"],
        "cuda_aware_decided_by": first["cuda_aware_decided_by"],
        "transport_rank0": {str(r): docs[r]["transport"] for r in args.ranks},
        "host": platform.node(),
        "command": " ".join(sys.argv),
        "mpiexec_args": os.environ.get("MULTIREDUCE_MPIEXEC_ARGS", ""),
        "timing": "Barrier + stream sync + MPI.Wtime around one call, max over ranks; median of repeat "
        "(local and total interleaved); *_min: the best",
        "repeat": args.repeat,
        "weak_per_rank": args.weak_per_rank,
        "strong_n": strong,
        "launches": launches,
        "elapsed_s": elapsed,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "summary": summary,
        "checks_failed": len(failed),
        "records": records,
        "single_device": [
            {"device": d["devices"][0], **{k: rec[k] for k in ("n", "op", "local_s", "total_s")}}
            for d in per_device
            for rec in d["records"]
        ],
    }
    out = args.output
    if out is None:
        tag = "cpu" if args.cpu else f"{first['gpus_visible']}x{first['gpu'].split()[-1].lower()}"
        out = REPO / "bench" / "results" / f"multigpu_{tag}_{(git['commit'] or 'unknown')[:7]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"{'op':17s} {'R':>2} {'weak us':>9} {'weak comb':>9} {'weak eff':>8} "
        f"{'strong us':>9} {'comb':>7} {'speedup':>7}"
    )
    for s in summary:
        eff = "" if s["weak_efficiency"] is None else f"{s['weak_efficiency']:.3f}"
        spd = "" if s["strong_speedup"] is None else f"{s['strong_speedup']:.2f}"
        print(
            f"{s['op']:17s} {s['ranks']:>2} {s['weak_total_us']:9.1f} {s['weak_combine_us']:9.1f} {eff:>8} "
            f"{s['strong_total_us']:9.1f} {s['strong_combine_us']:7.1f} {spd:>7}"
        )
    for x in records:
        if "check_passed" in x:
            verdict = "ok" if x["check_passed"] else "FAILED"
            print(f"check ranks {x['ranks']} n {x['n']} {x['op']}: {verdict} ({x['check_how']})")
    for x in records:
        if x["ranks"] > 1:
            per_rank = " ".join(f"{t * 1e6:.1f}" for t in x["local_s_per_rank"])
            print(f"ranks {x['ranks']} n {x['n']} {x['op']}: local us per rank {per_rank}")
    for d in doc["single_device"]:
        print(f"device {d['device']} alone, n {d['n']} {d['op']}: local {d['local_s'] * 1e6:.1f} us")
    print(f"{len(failed)} check(s) failed; {elapsed:.0f} s; wrote {out}")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
