"""The kernel sources compile for sm_90 without register spills, stack frames or local memory.

The GPU backend compiles them at run time with NVRTC (through CuPy). The NVRTC test compiles
every default instantiation with NVRTC itself and checks ptxas's report; it needs only what
the ``test`` extra installs (``nvidia-cuda-nvrtc``, and ``nvidia-cuda-runtime`` for
``cuda_fp16.h``), so it runs in CI, on a machine without a GPU or a CUDA toolkit. The nvcc test
makes the same checks with nvcc where a toolkit is installed, and skips where it is not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import multireduce._kernels as kernels


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found is None and Path("/usr/local/cuda/bin/nvcc").exists():
        found = "/usr/local/cuda/bin/nvcc"
    return found


def test_nvcc_sm90_no_spills(tmp_path):
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    names = kernels.default_kernel_names()
    # Taking each instantiation's address makes nvcc compile it, as NVRTC's name
    # expressions do.
    unit = tmp_path / "instances.cu"
    unit.write_text(
        f'#include "{kernels.HEADER}"\n'
        "void* const multireduce_instances[] = {\n" + ",\n".join(f"    (void*)&{name}" for name in names) + "\n};\n"
    )
    proc = subprocess.run(
        [
            nvcc,
            "-arch=sm_90",
            "-std=c++17",
            "-Xptxas",
            "-v",
            "-I",
            str(kernels.kernel_dir()),
            "-cubin",
            "-o",
            str(tmp_path / "k.cubin"),
            str(unit),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    check_ptxas_report(report, names)


def check_ptxas_report(report: str, names: list[str]) -> None:
    """ptxas's ``-v`` report compiled every kernel in ``names`` without spills or local memory."""
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", report)
    assert len(entries) == len(names), report
    frames = re.findall(
        # nvcc puts the figures on the next line; NVRTC's log repeats "ptxas ." before them
        r"Function properties for (\w+)\s+(?:ptxas\s+\.\s+)?(\d+) bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads",
        report,
    )
    assert len(frames) >= len(names), report
    offenders = [f for f in frames if f[1:] != ("0", "0", "0")]
    assert not offenders, f"stack frame or spills in the kernels: {offenders}\n{report}"
    assert not re.search(r"[1-9]\d* bytes lmem", report), report
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    # At most 128 registers keeps at least two 256-thread blocks on each SM.
    assert registers and max(registers) <= 128, registers


def find_cuda_include() -> Path | None:
    """A CUDA include directory with cuda_fp16.h: the ``nvidia-cuda-runtime`` wheel's, else a toolkit's."""
    from cuda.pathfinder import find_nvidia_header_directory  # a dependency of cuda-bindings

    found = find_nvidia_header_directory("cudart")
    candidates = [Path(found)] if found is not None else []
    nvcc = find_nvcc()
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda_fp16.h").exists()), None)


def test_nvrtc_compiles_every_default_kernel():
    # The GPU backend compiles with NVRTC, which differs from nvcc (no host headers, fewer
    # builtins): compile exactly what CuPy's RawModule would, with NVRTC itself.
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    include = find_cuda_include()
    if include is None:
        pytest.skip("no CUDA include directory with cuda_fp16.h")
    try:
        err, prog = nvrtc.nvrtcCreateProgram(kernels.read_source().encode(), b"reduce.cu", 0, [], [])
    except RuntimeError as exc:  # cuda-bindings raises this when libnvrtc cannot be loaded
        pytest.skip(f"libnvrtc is not available: {exc}")
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    names = kernels.default_kernel_names()
    for name in names:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, name.encode())
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, (name, err)
    options = [b"--std=c++17", b"-arch=sm_90", b"-I" + str(include).encode(), b"--ptxas-options=-v"]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")
    for name in names:
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, name.encode())
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS and lowered, name
    nvrtc.nvrtcDestroyProgram(prog)
    check_ptxas_report(log.rstrip(b"\0").decode(errors="replace"), names)
