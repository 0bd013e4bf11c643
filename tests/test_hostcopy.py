"""The native copy engine (multireduce._hostcopy): built with the system C compiler and run on
the CPU with its host-to-host stand-in for the upload (``mr_test_upload``), so that the copy,
the piece table, the threads, errors and the build itself are tested where there is no GPU.
The engine inside the pipeline is tested in test_stream.py; with the real driver, on the GPU.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from reference import run_in_threads

from multireduce import _hostcopy, stream


@pytest.fixture
def lib(native_stand_in):
    return native_stand_in


def table_for(src: np.ndarray, staged: np.ndarray, dev: np.ndarray, bounds) -> np.ndarray:
    """Pieces [bounds[i], bounds[i+1]) of the byte arrays, each to the same offsets."""
    b = np.asarray(bounds, dtype=np.uint64)
    t = np.zeros(b.size - 1, _hostcopy.PIECE_DTYPE)
    t["src"] = src.ctypes.data + b[:-1]
    t["staged"] = staged.ctypes.data + b[:-1]
    t["device"] = dev.ctypes.data + b[:-1]
    t["nbytes"] = np.diff(b)
    return t


def upload(lib) -> int:
    return _hostcopy.address(lib, "mr_test_upload")


@pytest.mark.parametrize("flags", [0, _hostcopy.STREAMING_STORES])
@pytest.mark.parametrize("threads", [1, 2, 5, 16])
@pytest.mark.parametrize("npieces", [0, 1, 3, 37])
def test_every_piece_is_copied_and_uploaded_once(lib, npieces, threads, flags):
    rng = np.random.default_rng(npieces * 100 + threads)
    src = rng.integers(0, 256, 300_001, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    # Uneven pieces, empty ones among them, at odd offsets.
    cuts = np.sort(rng.integers(0, src.size, max(npieces - 1, 0)))
    bounds = [0, *cuts, src.size] if npieces else [0]
    _hostcopy.stage(table_for(src, staged, dev, bounds), threads, upload(lib), flags=flags)
    assert lib.mr_test_calls() == npieces
    end = src.size if npieces else 0
    assert np.array_equal(dev[:end], src[:end]) and np.array_equal(staged[:end], src[:end])
    assert not dev[end:].any()


@pytest.mark.parametrize("head", [0, 1, 7, 15, 16, 33])
@pytest.mark.parametrize("size", [0, 1, 63, 64, 4095, 4096, 4097, 70_001])
def test_streaming_stores_at_every_alignment(lib, head, size):
    src = np.arange(80_000, dtype=np.uint32).view(np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    start = 3 + head  # source and destination misaligned differently
    t = table_for(src[start:], staged[head:], dev[head:], [0, size])
    _hostcopy.stage(t, 1, upload(lib), flags=_hostcopy.STREAMING_STORES)
    assert np.array_equal(staged[head : head + size], src[start : start + size])
    assert not staged[:head].any() and not staged[head + size :].any()


@pytest.mark.parametrize("threads", [1, 4])
def test_a_failing_upload_stops_the_job_and_names_the_piece(lib, threads):
    src = np.arange(64 * 1000, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    lib.mr_test_configure(5, 700)  # the fifth upload fails with code 700
    with pytest.raises(RuntimeError, match=r"upload of piece \d+ \(1000 bytes\) failed: code 700 here"):
        _hostcopy.stage(
            table_for(src, staged, dev, range(0, src.size + 1, 1000)),
            threads,
            upload(lib),
            describe=lambda rc: f"code {rc} here",
        )
    # No piece is started after the failure: at most one per thread was under way.
    assert 5 <= lib.mr_test_calls() <= 5 + threads - 1
    if threads == 1:
        assert np.array_equal(dev[:4000], src[:4000]) and not dev[4000:].any()


def test_concurrent_callers_each_get_their_own_pieces(lib):
    def call(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            src = rng.integers(0, 256, 100_000, dtype=np.uint8)
            staged, dev = np.zeros_like(src), np.zeros_like(src)
            threads = int(rng.integers(1, 9))
            _hostcopy.stage(table_for(src, staged, dev, range(0, 100_001, 10_000)), threads, upload(lib))
            assert np.array_equal(dev, src)

    run_in_threads([functools.partial(call, s) for s in range(4)])
    assert lib.mr_test_calls() == 4 * 30 * 10


def _stage_in_child(queue):
    lib = _hostcopy.load()
    src = np.arange(100_000, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    _hostcopy.stage(table_for(src, staged, dev, range(0, 100_001, 5000)), 6, upload(lib))
    queue.put(bool(np.array_equal(dev, src)))


def test_a_forked_child_starts_its_own_threads(lib):
    # The parent's pool threads do not exist in a forked child: it must not wait for them.
    src = np.arange(10_000, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)  # alive while the engine writes them
    _hostcopy.stage(table_for(src, staged, dev, range(0, 10_001, 1000)), 6, upload(lib))
    assert lib.mr_pool_workers() >= 5
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
        child = ctx.Process(target=_stage_in_child, args=(queue,))
        child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) is True


def test_bad_tables_are_refused(lib):
    with pytest.raises(TypeError, match="PIECE_DTYPE"):
        _hostcopy.stage(np.zeros(3, np.uint64), 1, upload(lib))
    with pytest.raises(TypeError, match="PIECE_DTYPE"):
        _hostcopy.stage(np.zeros(6, _hostcopy.PIECE_DTYPE)[::2], 1, upload(lib))
    # A table at an odd address: C reads its uint64 fields in place (undefined behaviour there).
    odd = np.zeros(_hostcopy.PIECE_DTYPE.itemsize * 2 + 1, np.uint8)[1:].view(_hostcopy.PIECE_DTYPE)
    with pytest.raises(TypeError, match="8-byte aligned"):
        _hostcopy.stage(odd, 1, upload(lib))
    with pytest.raises(ValueError, match="threads must be an integer from 1 to 256, got 0"):
        _hostcopy.stage(np.zeros(1, _hostcopy.PIECE_DTYPE), 0, upload(lib))


# hostcopy.c linked with a pthread_create that fails from its BUDGET-th call on: the workers
# that could be started do the job (a call under a thread limit used to fail, and every later
# call with it).
_FEW_THREADS = r"""
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "hostcopy.c"

static atomic_int budget;
int __real_pthread_create(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
    if (atomic_fetch_sub(&budget, 1) <= 0) return EAGAIN;
    return __real_pthread_create(t, a, f, arg);
}
static int up(uint64_t dst, const void *src, size_t n, void *stream) {
    (void)stream;
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static int job(int threads) {
    static char src[64 * 4096], staged[64 * 4096], dev[64 * 4096];
    mr_piece p[64];
    for (int i = 0; i < 64 * 4096; ++i) src[i] = (char)(i * 7 + threads);
    memset(dev, 0, sizeof dev);
    for (int i = 0; i < 64; ++i)
        p[i] = (mr_piece){(uintptr_t)(src + 4096 * i), (uintptr_t)(staged + 4096 * i),
                          (uintptr_t)(dev + 4096 * i), 4096, 0};
    size_t failed;
    int rc = mr_stage(p, 64, threads, 0, up, NULL, NULL, &failed);
    return rc != 0 ? rc : memcmp(src, dev, sizeof dev) != 0 ? 1000 : 0;
}
int main(void) {
    atomic_store(&budget, 2);  /* 2 workers of the 7 asked for */
    int a = job(8);
    int workers = mr_pool_workers();
    atomic_store(&budget, 0);  /* none more */
    int b = job(16);
    printf("%d %d %d\n", a, workers, b);
    return 0;
}
"""


def test_a_call_under_a_thread_limit_uses_the_workers_it_has(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler and GNU ld's --wrap (Linux)")
    (tmp_path / "few.c").write_text(_FEW_THREADS)
    exe = tmp_path / "few"
    subprocess.run(
        [cc, "-std=c11", "-O1", "-pthread", f"-I{_hostcopy.SOURCE.parent}", "-Wl,--wrap=pthread_create",
         "-o", str(exe), str(tmp_path / "few.c")],
        check=True,
    )  # fmt: skip
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["0", "2", "0"], done.stdout


def test_the_library_is_cached_by_source_and_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    plain = _hostcopy.library_path()
    assert plain.parent == tmp_path and plain.name.startswith("hostcopy-")
    monkeypatch.setenv("CC", "cc -g")
    assert _hostcopy.library_path() != plain


@pytest.mark.parametrize(
    ("cc", "match"),
    [("/nonexistent/bin/cc", "cannot build the native copy engine: running"), ("false", "exited with 1")],
)
def test_a_build_failure_says_why(monkeypatch, tmp_path, cc, match):
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", cc)
    monkeypatch.setattr(_hostcopy, "_lib", None)
    monkeypatch.setattr(_hostcopy, "_lib_path", None)
    with pytest.raises(_hostcopy.NativeUnavailable, match=match):
        _hostcopy.load()
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


def test_a_fresh_build_loads_and_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_hostcopy, "_lib", None)
    monkeypatch.setattr(_hostcopy, "_lib_path", None)
    lib = _hostcopy.load()
    assert _hostcopy.library_path().exists() and _hostcopy.library_path().parent == tmp_path
    src = np.arange(5000, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    _hostcopy.stage(table_for(src, staged, dev, [0, 2500, 5000]), 2, upload(lib))
    assert np.array_equal(dev, src)


# -- the choice of engine (stream.COPY_ENGINE) ---------------------------------------------------


def _unavailable():
    raise _hostcopy.NativeUnavailable("no compiler here")


def test_copy_engine_settings(monkeypatch):
    monkeypatch.setattr(stream, "COPY_ENGINE", "python")
    assert stream.copy_engine()["engine"] == "python" and not stream._native_enabled()
    monkeypatch.setattr(stream, "COPY_ENGINE", "native")
    info = stream.copy_engine()
    assert info["engine"] == "native" and info["library"] == str(_hostcopy.library_path())
    monkeypatch.setattr(stream, "COPY_ENGINE", "fast")
    with pytest.raises(ValueError, match="'auto', 'native', 'python', not 'fast'"):
        stream._native_enabled()


def test_auto_warns_once_when_the_engine_cannot_be_built(monkeypatch):
    monkeypatch.setattr(_hostcopy, "load", _unavailable)
    monkeypatch.setattr(stream, "_engine_warned", False)
    monkeypatch.setattr(stream, "COPY_ENGINE", "auto")
    with pytest.warns(RuntimeWarning, match="copies with Python threads.*no compiler here"):
        assert stream._native_enabled() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stream._native_enabled() is False  # once per process
    assert stream.copy_engine() == {"setting": "auto", "engine": "python", "reason": "no compiler here"}
    monkeypatch.setattr(stream, "COPY_ENGINE", "native")
    with pytest.raises(_hostcopy.NativeUnavailable, match="no compiler here"):
        stream._native_enabled()
    with pytest.raises(_hostcopy.NativeUnavailable, match="no compiler here"):
        stream.copy_engine()


# -- build failures: named, remembered, and "auto" falls back -------------------------------------


@pytest.fixture
def fresh_engine(monkeypatch):
    """No engine loaded and no failure remembered, as in a new process (restored afterwards)."""
    monkeypatch.setattr(_hostcopy, "_lib", None)
    monkeypatch.setattr(_hostcopy, "_lib_path", None)
    monkeypatch.setattr(_hostcopy, "_failures", {})
    monkeypatch.setattr(stream, "_engine_warned", False)
    monkeypatch.setattr(stream, "COPY_ENGINE", "auto")


def test_a_cache_dir_that_cannot_be_made_is_named(monkeypatch, tmp_path, fresh_engine):
    # MULTIREDUCE_CACHE_DIR under a regular file: a raw NotADirectoryError escaped copy_engine(),
    # so "auto" neither fell back nor warned.
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", str(tmp_path / "afile" / "sub"))
    with pytest.raises(
        _hostcopy.NativeUnavailable, match="making the cache directory .*afile/sub.* MULTIREDUCE_CACHE_DIR"
    ) as info:
        _hostcopy.load()
    assert isinstance(info.value.__cause__, NotADirectoryError)
    with pytest.warns(RuntimeWarning, match="copies with Python threads.*MULTIREDUCE_CACHE_DIR"):
        assert stream._native_enabled() is False
    engine = stream.copy_engine()
    assert engine["engine"] == "python" and "Not a directory" in engine["reason"]
    monkeypatch.setattr(stream, "COPY_ENGINE", "native")
    with pytest.raises(_hostcopy.NativeUnavailable, match="MULTIREDUCE_CACHE_DIR"):
        stream.copy_engine()


def test_a_cache_dir_that_cannot_be_written_is_named(monkeypatch, fresh_engine):
    # A directory that exists but takes no new files (procfs refuses them, root or not).
    import os

    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", "/proc/self")
    with pytest.raises(_hostcopy.NativeUnavailable, match="writing into the cache directory '/proc/self'") as info:
        _hostcopy.load()
    assert isinstance(info.value.__cause__, OSError)
    assert stream.copy_engine()["engine"] == "python"


def test_info_reports_the_fallback_instead_of_failing(tmp_path):
    # `python -m multireduce info` exited 1 with a traceback for an unusable cache directory.
    import os
    import subprocess
    import sys

    (tmp_path / "afile").write_text("")
    env = {**os.environ, "MULTIREDUCE_CACHE_DIR": str(tmp_path / "afile" / "sub")}
    done = subprocess.run(
        [sys.executable, "-m", "multireduce", "info"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "stream copy engine: python (cannot build the native copy engine" in done.stdout
    assert "MULTIREDUCE_CACHE_DIR" in done.stdout


def _logging_compiler(tmp_path, name: str, *, works: bool):
    """A compiler script that appends a line to ``<name>.log`` each run, then fails or runs cc."""
    log = tmp_path / f"{name}.log"
    script = tmp_path / name
    body = 'exec cc "$@"' if works else 'echo "fakecc: error: cannot compile" >&2; exit 1'
    script.write_text(f'#!/bin/sh\necho run >> "{log}"\n{body}\n')
    script.chmod(0o755)
    return script, log


def test_a_failed_build_is_not_run_again(monkeypatch, tmp_path, fresh_engine):
    # A failing compiler ran on every call: 8 runs for 5 reduces and 3 copy_engine() calls.
    cc, log = _logging_compiler(tmp_path, "failing-cc", works=False)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(_hostcopy.NativeUnavailable, match="exited with 1:\nfakecc: error: cannot compile"):
        _hostcopy.load()
    for _ in range(3):
        with pytest.raises(_hostcopy.NativeUnavailable, match="fakecc: error: cannot compile"):
            _hostcopy.load()
        assert stream.copy_engine()["engine"] == "python"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            assert stream._native_enabled() is False
    assert [str(w.message) for w in caught if w.category is RuntimeWarning][:1] and len(caught) == 1  # warned once
    assert log.read_text().splitlines() == ["run"]
    # Another configuration is tried afresh: a working compiler (another CC) builds and loads.
    good, good_log = _logging_compiler(tmp_path, "working-cc", works=True)
    monkeypatch.setenv("CC", str(good))
    lib = _hostcopy.load()
    assert good_log.read_text().splitlines() == ["run"] and lib.mr_max_threads() == _hostcopy.MAX_THREADS
    assert stream.copy_engine()["engine"] == "native"


def test_a_missing_source_is_unavailable_not_a_crash(monkeypatch, tmp_path, fresh_engine):
    monkeypatch.setattr(_hostcopy, "SOURCE", tmp_path / "missing.c")
    with pytest.raises(_hostcopy.NativeUnavailable, match=r"C source .*missing\.c.* cannot be read") as info:
        _hostcopy.load()
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert stream.copy_engine()["engine"] == "python"


# -- threads: the C int --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "exc"), [(0, ValueError), (257, ValueError), (2**40, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_threads_outside_the_engines_range_are_refused(lib, threads, exc):
    # ctypes cut 2**40 to the C int's low bits: 0, "bad arguments to mr_stage".
    src = np.arange(100, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    with pytest.raises(exc, match=r"threads must be an integer from 1 to 256, got"):
        _hostcopy.stage(table_for(src, staged, dev, [0, 100]), threads, upload(lib))
    with pytest.raises(ValueError, match="flags must be 0 or STREAMING_STORES"):
        _hostcopy.stage(table_for(src, staged, dev, [0, 100]), 1, upload(lib), flags=2)
    _hostcopy.stage(table_for(src, staged, dev, [0, 100]), _hostcopy.MAX_THREADS, upload(lib))  # one piece: one thread
    assert np.array_equal(dev, src)


def test_the_c_engine_refuses_more_threads_than_it_has_room_for(lib):
    # It used to cut them to 64 silently; the limit is now the one Python checks first.
    import ctypes

    assert lib.mr_max_threads() == _hostcopy.MAX_THREADS == 256
    src = np.arange(100, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    t = table_for(src, staged, dev, [0, 100])
    failed = ctypes.c_size_t(0)
    rc = lib.mr_stage(
        t.ctypes.data, t.size, _hostcopy.MAX_THREADS + 1, 0, upload(lib), None, None, ctypes.byref(failed)
    )
    assert rc == -2 and not dev.any()


def test_tables_that_are_not_one_dimensional_arrays_are_refused(lib):
    # A list used to fail with AttributeError, and a 2-d table, whose pieces C reads in place
    # all the same, lost a failed upload's error to an IndexError naming its piece.
    src = np.arange(6000, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    t = table_for(src, staged, dev, range(0, 6001, 1000))
    with pytest.raises(TypeError, match="PIECE_DTYPE"):
        _hostcopy.stage(list(t), 1, upload(lib))
    lib.mr_test_configure(5, 700)
    with pytest.raises(TypeError, match="1-d"):
        _hostcopy.stage(t.reshape(2, 3), 1, upload(lib))
    assert lib.mr_test_calls() == 0 and not dev.any()


@pytest.mark.parametrize("what", ["upload", "setctx", "ctx"])
@pytest.mark.parametrize("value", ["mr_test_upload", 1.5, True, -1])
def test_addresses_that_are_not_addresses_are_refused(lib, what, value):
    # ctypes passed a str's characters as the function's address (the process crashed), and 0
    # or None for `upload` was only "bad arguments to mr_stage".
    src = np.arange(100, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    kw = {"upload": upload(lib), what: value}
    exc = ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError
    with pytest.raises(exc, match=f"{what} must be"):
        _hostcopy.stage(table_for(src, staged, dev, [0, 100]), 1, **kw)
    assert not dev.any()


@pytest.mark.parametrize(("value", "exc"), [(0, ValueError), (None, TypeError)])
def test_a_missing_upload_function_is_named(lib, value, exc):
    # As documented: 0 is an integer that is not positive (ValueError), None not an integer.
    src = np.arange(100, dtype=np.uint8)
    staged, dev = np.zeros_like(src), np.zeros_like(src)
    with pytest.raises(exc, match="upload must be the address of an upload function"):
        _hostcopy.stage(table_for(src, staged, dev, [0, 100]), 1, value)
    assert lib.mr_test_calls() == 0 and not dev.any()


def test_a_truncated_cached_library_is_rebuilt_not_loaded(tmp_path):
    # A library cut short (a crash before it reached the disk, a partial copy of the cache):
    # the loader mapped pages past its end and the process died of SIGBUS (exit 135). Each
    # library has its digest beside it, checked before loading; a mismatch rebuilds it. In
    # a child process: the old code's failure was a crash.
    env = {**os.environ, "MULTIREDUCE_CACHE_DIR": str(tmp_path)}
    env.pop("CC", None)
    probe = [sys.executable, "-c", "import multireduce.stream as s; print(s.copy_engine()['engine'])"]
    first = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and first.stdout.split() == ["native"], first.stderr
    (lib,) = tmp_path.glob("hostcopy-*.so")
    assert (lib.stat().st_mode & 0o777) == 0o755  # readable by every user of a shared cache
    whole = lib.read_bytes()
    assert (tmp_path / (lib.name + ".sha256")).read_text().strip() == hashlib.sha256(whole).hexdigest()
    lib.write_bytes(whole[:4000])
    again = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.split() == ["native"], (again.returncode, again.stderr)
    assert lib.read_bytes() == whole  # rebuilt: the same compiler and source give the same file
    (tmp_path / (lib.name + ".sha256")).unlink()  # another version's library, without its digest
    assert not _hostcopy._intact(lib)


@pytest.mark.parametrize(
    ("cc", "match"),
    [("cc '", "is not a command line"), ("BADCC", "exited with 1")],
)
def test_a_compiler_setting_that_cannot_run_falls_back(monkeypatch, tmp_path, fresh_engine, cc, match):
    # An unclosed quote in CC (shlex's ValueError) and a compiler whose output is not UTF-8
    # (UnicodeDecodeError) escaped copy_engine() instead of the warning and Python threads.
    if cc == "BADCC":
        script = tmp_path / "badcc"
        script.write_text("#!/bin/sh\nprintf '\\377\\376 broken\\n' >&2\nexit 1\n")
        script.chmod(0o755)
        cc = str(script)
    monkeypatch.setenv("MULTIREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", cc)
    with pytest.raises(_hostcopy.NativeUnavailable, match=match):
        _hostcopy.load()
    with pytest.warns(RuntimeWarning, match="copies with Python threads"):
        assert stream._native_enabled() is False
    engine = stream.copy_engine()
    assert engine["engine"] == "python" and match.split()[0] in engine["reason"], engine
