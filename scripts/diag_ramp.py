"""Ramped against uniform pieces in the pageable streaming path, on the GPU host (wall-time medians).

``stream.RAMP`` picks the inputs whose pieces ramp ("off", "large": larger than the slots,
"all").

1. ``stream.reduce`` of 2^24 float32 from pageable memory (the seed's case) for two piece
   schedules: uniform (``RAMP="off"``, 2 pieces per thread) and ramped (``RAMP="all"``,
   ``stream.ramp_pieces``); back to back, between ``np.sum`` and ``cupy.asarray(h).sum()``
   (as ``bench_stream.py`` interleaves them) and after an idle pause as long as those peers.
   Three rounds, so that drift shows.
2. 1 GiB and 4 GiB from pageable memory, uniform against ramped.
3. One call's timeline with uniform pieces: for each piece, the thread, its size, and when
   its copy started and ended and its upload was issued; and when the call returned.
4. The calling thread's end of a 2^24 call: when the copies were joined, each segment's
   kernel launched, the slots returned, the partials combined and the result reached the host.

Earlier versions of this script measured options since removed (their output is committed):
ramped pieces with one piece per thread (no better) and each Dask task's chunk ramped over
2-4 steps (47-52 ms against 46 ms uniform) at commit 6befd12; each segment's kernel launched
by the copy thread that issued its last upload (4.45-4.62 ms between peers against 4.16-4.27)
at commit f1b4112.
"""

import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy as cp  # noqa: E402
from _benchutil import median_time as med  # noqa: E402
from _benchutil import timed_calls  # noqa: E402

from multireduce import stream  # noqa: E402

# These diagnostics study the Python copy threads (the pieces they cut); scripts/diag_native.py
# studies the native engine, which cuts its own pieces.
stream.COPY_ENGINE = "python"

n = 1 << 24
host = (np.arange(n, dtype=np.int64) % 1024).astype(np.float32)
exact = float(np.sum(host, dtype=np.float64))


def peers():
    np.sum(host)
    float(cp.asarray(host).sum())


SCHEDULES = {"uniform ppt=2": ("off", 2), "ramp ppt=2": ("all", 2)}


def use(name):
    stream.RAMP, stream.PIECES_PER_THREAD = SCHEDULES[name]


t_peers = med(peers, 5)
print(f"peers take {t_peers * 1e3:.1f} ms")
for rnd in range(3):
    for name in SCHEDULES:
        use(name)
        one = lambda: float(stream.reduce(host, "sum"))  # noqa: E731
        assert one() == exact
        t = med(one)
        ti = med(one, between=peers)
        ts = med(one, 11, between=lambda: time.sleep(t_peers))
        piece_bytes = stream.make_plan(host.nbytes, 4).piece_bytes
        pieces = len(stream._pieces_of(host, piece_bytes, 8 if stream.RAMP == "all" else 1)[1])
        print(
            f"round {rnd} 2^24 {name:14s} ({pieces:2d} pieces): back to back {t * 1e3:6.3f} ms, "
            f"between peers {ti * 1e3:6.3f} ms, after a sleep {ts * 1e3:6.3f} ms"
        )


def large(gib):
    big = (np.arange(gib << 28, dtype=np.int64) % 1024).astype(np.float32)
    big_exact = float(np.sum(big, dtype=np.float64))
    for name in ("uniform ppt=2", "ramp ppt=2", "uniform ppt=2", "ramp ppt=2"):
        use(name)
        assert float(stream.reduce(big, "sum")) == big_exact
        t = med(lambda: float(stream.reduce(big, "sum")), 5)
        print(f"{gib} GiB pageable {name:14s}: {t * 1e3:8.2f} ms {big.nbytes / t / 1e9:6.1f} GB/s")


large(1)
large(4)
use("ramp ppt=2")


def timeline(name, between=None):
    use(name)
    events = []
    real_fill, real_upload = stream._Pipeline.fill, stream._CupyDevice.upload

    def fill(slot, piece, offset=0):
        t0 = time.perf_counter()
        real_fill(slot, piece, offset)
        events.append(("copy", threading.get_ident(), piece.nbytes, t0, time.perf_counter()))

    def upload(self, slot, nbytes, offset=0):
        t0 = time.perf_counter()
        real_upload(self, slot, nbytes, offset)
        events.append(("upload", threading.get_ident(), nbytes, t0, time.perf_counter()))

    stream._Pipeline.fill, stream._CupyDevice.upload = staticmethod(fill), upload
    try:
        start, end = timed_calls(lambda: float(stream.reduce(host, "sum")), 3, between=between, before=events.clear)
    finally:
        stream._Pipeline.fill, stream._CupyDevice.upload = staticmethod(real_fill), real_upload
    label = "between peers" if between else "back to back"
    threads = {tid: i for i, tid in enumerate(dict.fromkeys(e[1] for e in sorted(events, key=lambda e: e[3])))}
    copies = sorted((e for e in events if e[0] == "copy"), key=lambda e: e[3])
    uploads = [e for e in events if e[0] == "upload"]
    print(f"timeline {name}, {label}: total {1e3 * (end - start):.3f} ms; per piece: thread, MiB, copy ms, upload ms")
    for _, tid, nbytes, t0, t1 in copies:
        up = min((u for u in uploads if u[1] == tid and u[3] >= t1), key=lambda u: u[3], default=None)
        up_s = f"{1e3 * (up[3] - start):6.3f} -> {1e3 * (up[4] - start):6.3f}" if up else "-"
        print(
            f"  t{threads[tid]:<2d} {nbytes / (1 << 20):5.2f}  {1e3 * (t0 - start):6.3f} -> {1e3 * (t1 - start):6.3f}"
            f"  ({nbytes / (t1 - t0) / 1e9:5.1f} GB/s)  {up_s}"
        )
    last = max(e[4] for e in events)
    print(f"  the call returned {1e3 * (end - last):.3f} ms after the last upload was issued")


timeline("uniform ppt=2")
timeline("uniform ppt=2", between=peers)
stream.free_staging()


# -- 4. where the end of a 2^24 call goes -------------------------------------------------------
def phases(name, between=None, calls=5):
    """Wall-clock marks inside the calling thread's end of the call (the resident path)."""
    use(name)
    marks = []
    wrapped = {
        (stream, "_join"): "copies joined",
        (stream._CupyDevice, "reduce"): "kernel launched",
        (stream, "_settle_all"): "slots returned",
        (stream._partials, "finalize"): "partials combined",
        (stream._CupyDevice, "to_host"): "result on the host",
    }
    real = {key: getattr(*key) for key in wrapped}

    def timed(key, label):
        fn = real[key]

        def inner(*args, **kwargs):
            out = fn(*args, **kwargs)
            marks.append((label, time.perf_counter()))
            return out

        return inner

    for key, label in wrapped.items():
        setattr(*key, timed(key, label))
    rows = []

    def record(start, end):
        rows.append([(label, 1e3 * (t - start)) for label, t in marks] + [("returned", 1e3 * (end - start))])

    try:
        timed_calls(lambda: float(stream.reduce(host, "sum")), calls, between=between, before=marks.clear, after=record)
    finally:
        for key, fn in real.items():
            setattr(*key, fn)
    label = "between peers" if between else "back to back"
    print(f"phases of a 2^24 call, {name}, {label} (ms from the call's start; {calls} calls):")
    for row in rows:
        print("  " + ", ".join(f"{name} {t:.3f}" for name, t in row))


phases("uniform ppt=2")
phases("uniform ppt=2", between=peers)
stream.free_staging()
