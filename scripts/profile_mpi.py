"""Where the MPI layer's per-call time goes, piece by piece, for one-element CuPy shards.

Each line times one piece per call (best of ``--repeat`` repetitions of ``--inner`` calls,
each repetition between ``Barrier``s, the maximum over ranks), every piece that touches the
GPU followed by a stream synchronization:

``sync``               an idle stream's synchronization alone
``local``              ``core.partial(x, "sum")`` (a new 0-d device array)
``local+d2h``          the same, then an 8-byte device-to-host copy into pinned memory
``local->mapped``      ``core.partial(x, "sum", out=slot)``: the kernel writes pinned host memory
``local->mapped query`` the same, waiting by polling ``cudaStreamQuery`` instead
``local->mapped spin`` the same, then ``cuStreamWriteValue32`` of a sequence number into mapped
                       pinned memory behind the kernel, waiting by reading it in a loop
``empty``              ``cupy.empty(())`` alone (no synchronization)
``upload memcpy``      a new 0-d array filled from pinned memory with ``memcpyAsync`` (how
                       results came back before the result cells)
``result cell``        ``mpi._from_host``: the value stored into a result cell (pinned,
                       device-mapped host memory; no copy on the stream)
``upload pageable``    the same from ordinary memory with a synchronous ``memcpy``
``upload writevalue``  the same with the driver's ``cuStreamWriteValue64`` (where it runs)
``mapped+upload now``  the GPU part of a combine: local->mapped, wait, then the upload
``mapped+upload waitvalue``  the same with the upload issued before the wait, behind
                       ``cuStreamWaitValue32`` on a host flag set once the value is there
``allreduce OP``       ``multireduce.mpi.allreduce(x, OP)`` (the per-call path)
``allreduce OP (general)`` the same through the general path (the op as an ``Op`` object)
``allreduce OP (d2h)`` the general path with the partial copied, as before the kernel wrote host memory
``local mean (state)`` ``core.partial(x, "mean")``: the moments kernel, its state on the host
``stats``              ``multireduce.mpi.stats(x)``
``allreduce mean``     ``multireduce.mpi.allreduce(x, "mean")``
``local argmax (state)`` ``core.partial(x, "argmax")``: the arg kernel, its state on the host
``allreduce argmax``   ``multireduce.mpi.allreduce(x, "argmax")``
``Allreduce 8B/104B``  ``comm.Allreduce`` of a host buffer alone (MPI's floor; 104 B is the agreement's size)

Rank 0 then prints a cProfile (by own time) of each of :data:`PROFILED`.

Run with ``mpirun -n 1|2 python scripts/profile_mpi.py --output FILE.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import numpy as np

from multireduce import _provenance, core, get_op, mpi
from multireduce.mpi import MPI

#: The cases profiled with cProfile after the timings.
PROFILED = ("allreduce sum", "allreduce mean", "stats", "allreduce argmax")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inner", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()

    import cupy

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    device = mpi.select_device(comm)
    runtime = cupy.cuda.runtime
    stream = cupy.cuda.get_current_stream()
    x = cupy.arange(1, dtype=np.float32) + 1
    plan, _ = mpi._plan(x, "sum", None)
    slot = mpi._Staging.slot(plan)
    # 16 bytes of pinned, device-mapped host memory for the upload experiments (slot 8 of
    # the layer's staging slots before the result cells).
    legacy_mem = cupy.cuda.PinnedMemoryPointer(
        cupy.cuda.PinnedMemory(16, runtime.hostAllocPortable | runtime.hostAllocMapped), 0
    )
    legacy = np.frombuffer(legacy_mem, dtype=np.uint8, count=16)
    hptr = legacy.ctypes.data
    value = np.float32(1.0)
    page = np.zeros(1, dtype=np.float64)

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(args.repeat):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.inner):
                fn()
            t = (time.perf_counter() - t0) / args.inner
            best = min(best, comm.allreduce(t, op=MPI.MAX))
        return best * 1e6

    def local():
        core.partial(x, "sum")
        stream.synchronize()

    def local_d2h():
        part = core.partial(x, "sum")
        runtime.memcpyAsync(hptr, part.data.ptr, 8, runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()

    def local_mapped():
        core.partial(x, "sum", out=slot)
        stream.synchronize()

    def local_mapped_query():
        core.partial(x, "sum", out=slot)
        while not stream.done:
            pass

    def upload_memcpy():
        out = cupy.empty((), dtype=np.float64)
        runtime.memcpyAsync(out.data.ptr, hptr + 8, 8, runtime.memcpyHostToDevice, stream.ptr)
        stream.synchronize()

    def result_cell():
        mpi._from_host(value, plan)
        stream.synchronize()

    def upload_pageable():
        out = cupy.empty((), dtype=np.float64)
        runtime.memcpy(out.data.ptr, page.ctypes.data, 8, runtime.memcpyHostToDevice)
        stream.synchronize()

    cases = {
        "sync": stream.synchronize,
        "local": local,
        "local+d2h": local_d2h,
        "local->mapped": local_mapped,
        "local->mapped query": local_mapped_query,
        "empty": lambda: cupy.empty((), dtype=np.float64),
        "upload memcpy": upload_memcpy,
        "result cell": result_cell,
        "upload pageable": upload_pageable,
    }
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        write64 = libcuda.cuStreamWriteValue64_v2
        write64.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
        probe = cupy.empty((), dtype=np.float64)
        rc = write64(stream.ptr, probe.data.ptr, np.float64(2.5).view(np.uint64).item(), 0)
        stream.synchronize()
        if rc == 0 and float(probe) == 2.5:

            def upload_writevalue():
                out = cupy.empty((), dtype=np.float64)
                write64(stream.ptr, out.data.ptr, 4611686018427387904, 0)
                stream.synchronize()

            cases["upload writevalue"] = upload_writevalue
        elif rank == 0:
            print(f"cuStreamWriteValue64_v2: rc {rc}, value {float(probe)}")
    except (OSError, AttributeError) as exc:
        if rank == 0:
            print(f"cuStreamWriteValue64_v2 unavailable: {exc}")

    # The GPU part of one combine, without MPI and the layer's Python: the kernel writes the
    # partial into pinned host memory, a wait, and the result's upload. "now" is the layer's
    # order (upload issued after the value is known); "waitvalue" issues the upload before
    # the wait, behind cuStreamWaitValue32 on a flag in mapped pinned memory that the host
    # sets once the value is there.
    slots = mpi._Staging.get(device, stream.ptr)
    slot8 = legacy[8:].view(np.float64)

    def mapped_upload_now():
        core.partial(x, "sum", out=slot)
        out = cupy.empty((), dtype=np.float64)
        stream.synchronize()
        slot8[0] = 3.0
        runtime.memcpyAsync(out.data.ptr, hptr + 8, 8, runtime.memcpyHostToDevice, stream.ptr)
        stream.synchronize()

    cases["mapped+upload now"] = mapped_upload_now
    try:
        wait32 = ctypes.CDLL("libcuda.so.1").cuStreamWaitValue32_v2
        wait32.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        flags = runtime.hostAllocPortable | runtime.hostAllocMapped
        flag_mem = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(8, flags), 0)
        flag = np.frombuffer(flag_mem, dtype=np.uint32, count=2)
        flag[:] = 0
        flag_dev = runtime.pointerGetAttributes(flag.ctypes.data).devicePointer
        kernel_done = cupy.cuda.Event(disable_timing=True)
        seq = [0]

        def mapped_upload_waitvalue():
            core.partial(x, "sum", out=slot)
            out = cupy.empty((), dtype=np.float64)
            kernel_done.record(stream)
            seq[0] = seq[0] % 0xFFFFFFFF + 1
            rc = wait32(stream.ptr, flag_dev, seq[0], 0x1)  # CU_STREAM_WAIT_VALUE_EQ
            try:
                if rc:
                    raise RuntimeError(f"cuStreamWaitValue32_v2 returned {rc}")
                runtime.memcpyAsync(out.data.ptr, hptr + 8, 8, runtime.memcpyHostToDevice, stream.ptr)
                kernel_done.synchronize()
                slot8[0] = 3.0
            finally:
                flag[0] = seq[0]  # always: the stream must never be left waiting
            stream.synchronize()
            return out

        if float(mapped_upload_waitvalue()) == 3.0:
            cases["mapped+upload waitvalue"] = mapped_upload_waitvalue
        elif rank == 0:
            print("cuStreamWaitValue32_v2: wrong value uploaded")
        write32 = ctypes.CDLL("libcuda.so.1").cuStreamWriteValue32_v2
        write32.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        host_slot = slots.host_view(np.dtype(np.float64))

        def local_mapped_spin():
            core.partial(x, "sum", out=slot)
            seq[0] = seq[0] % 0xFFFFFFFF + 1
            rc = write32(stream.ptr, flag_dev + 4, seq[0], 0)  # after the kernel, with a fence
            if rc:
                raise RuntimeError(f"cuStreamWriteValue32_v2 returned {rc}")
            while flag[1] != seq[0]:
                pass
            return host_slot[0]

        if local_mapped_spin() == 1.0:
            cases["local->mapped spin"] = local_mapped_spin
        elif rank == 0:
            print("cuStreamWriteValue32_v2: wrong partial seen")
    except (OSError, AttributeError, RuntimeError) as exc:
        if rank == 0:
            print(f"cuStreamWaitValue32_v2 unavailable: {exc}")

    old_local = mpi._local_partial

    def d2h_local(xx, pl):  # the layer before the kernel wrote host memory
        if pl.static.requested is None:
            return core.partial(xx, pl.op)
        return old_local(xx, pl)

    for op in ("sum", "max", "min"):

        def call(op=op):
            mpi.allreduce(x, op)
            stream.synchronize()

        cases[f"allreduce {op}"] = call
    for op in ("sum", "max"):

        def call_general(op=op):
            mpi.allreduce(x, get_op(op))
            stream.synchronize()

        cases[f"allreduce {op} (general)"] = call_general

        def call_old(op=op):
            mpi._local_partial = d2h_local
            try:
                mpi.allreduce(x, get_op(op))
                stream.synchronize()
            finally:
                mpi._local_partial = old_local

        cases[f"allreduce {op} (d2h)"] = call_old

    def stats_call():
        mpi.stats(x)
        stream.synchronize()

    def mean_call():
        mpi.allreduce(x, "mean")
        stream.synchronize()

    def argmax_call():
        mpi.allreduce(x, "argmax")
        stream.synchronize()

    cases["local mean (state)"] = lambda: core.partial(x, "mean")
    cases["stats"] = stats_call
    cases["allreduce mean"] = mean_call
    cases["local argmax (state)"] = lambda: core.partial(x, "argmax")
    cases["allreduce argmax"] = argmax_call
    buf8, agreement = np.zeros(1), np.zeros(mpi._META_SIZE, dtype=np.int64)
    cases["Allreduce 8B"] = lambda: comm.Allreduce(MPI.IN_PLACE, buf8, op=MPI.SUM)
    cases[f"Allreduce {agreement.nbytes}B"] = lambda: comm.Allreduce(MPI.IN_PLACE, agreement, op=MPI.MAX)

    for fn in cases.values():  # warm up: compile, connect
        for _ in range(50):
            fn()
    results = {name: timed(fn) for name, fn in cases.items()}
    # Interleaved second pass: the figures must not depend on the order of the cases.
    second = {name: timed(fn) for name, fn in reversed(list(cases.items()))}
    results = {name: min(results[name], second[name]) for name in results}
    profile_text = ""
    if rank == 0:  # where the host time of one allreduce goes
        import cProfile
        import io
        import pstats

        for name in PROFILED:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.inner):
                cases[name]()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
            profile_text += f"--- cProfile: {name}\n" + text.getvalue()
    else:
        for name in PROFILED:
            for _ in range(args.inner):
                cases[name]()
    if rank == 0:
        gpu = runtime.getDeviceProperties(device)["name"]
        gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
        print(f"profile_mpi: {size} rank(s), {gpu}, {MPI.Get_library_version().splitlines()[0]}")
        for name, us in results.items():
            print(f"{name:22s} {us:8.2f} us")
        if args.output:
            report = {
                "meta": {
                    **_provenance.git_state(),
                    "gpu": gpu,
                    "ranks": size,
                    "inner": args.inner,
                    "repeat": args.repeat,
                },
                "per_call_us": results,
            }
            args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(profile_text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
