"""The kernel sources compile with nvcc for sm_90 without register spills or local memory.

NVRTC (through CuPy) compiles the same header at run time; this test runs wherever nvcc is
installed, GPU or not, and is skipped only where nvcc is absent.
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
        [nvcc, "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-I", str(kernels.kernel_dir()), "-cubin", "-o", str(tmp_path / "k.cubin"), str(unit)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", report)
    assert len(entries) == len(names), report
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(frames) >= len(names), report
    offenders = [f for f in frames if f != ("0", "0", "0")]
    assert not offenders, f"stack frame or spills in the kernels: {offenders}\n{report}"
    assert not re.search(r"[1-9]\d* bytes lmem", report), report
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert registers and max(registers) <= 64, registers
