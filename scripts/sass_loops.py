"""Registers and loads in flight of kernel instantiations, read from their SASS (no GPU needed).

Compiles the named instantiations of ``kernels/multireduce/*.cuh`` with nvcc for one
architecture, disassembles the cubin with ``cuobjdump -sass``, and prints for each kernel its
register count (ptxas ``-v``), the resident blocks per SM that count allows, and the number of
global loads (``LDG``) in each innermost loop. The largest of those is what one thread keeps
in flight in its main loop.

This is how the ninth session found why nansum over float32 columns ran at 0.78x the full
reduction: ptxas unrolled NanSum's column loop twice (16 loads) where Sum's got four trips
(32 loads). Example::

    python scripts/sass_loops.py --cols sum,nansum --dtype float32 --shapes 256x8,256x6

``nvcc`` must be on ``PATH`` (or in ``/usr/local/cuda/bin``); ``cuobjdump`` comes with the CUDA
toolkit or from PyPI (``pip install nvidia-cuda-cuobjdump``; pass ``--cuobjdump PATH``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from multireduce import _kernels
from multireduce.ops import get_op

_ENTRY = re.compile(r"Compiling entry function '(\S+)'")
_REGS = re.compile(r"Used (\d+) registers")
_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cols", default="sum,nansum", help="fold ops whose column kernel to compile")
    p.add_argument("--dtype", default="float32", help="input dtype (default float32)")
    p.add_argument("--shapes", default="", help="BLOCKxUNROLL shapes (default: the shipped cols_config)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    p.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    return p.parse_args(argv)


def instantiations(ops: list[str], dtype: np.dtype, shapes: list[tuple[int, int]]) -> list[str]:
    """Explicit instantiations of ``reduce_cols_kernel`` for each op and launch shape."""
    lines = []
    for name in ops:
        op = get_op(name)
        result = op.result_dtype(dtype)
        acc = op.accumulator_dtype(result)
        t, a, o = (_kernels.CTYPES[np.dtype(d)] for d in (dtype, acc, result))
        for block, unroll in shapes or [_kernels.cols_config(op, dtype, acc)]:
            kernel = _kernels.cols_kernel_name(op, dtype, acc, result, block, unroll)
            lines.append(
                f"template __global__ void {kernel}(const {t}*, long long, long long, long long, "
                f"{a}, {a}*, unsigned int*, {o}*);"
            )
    return lines


def loop_loads(sass: str) -> list[int]:
    """The number of LDG instructions in each innermost loop (backward branch) of one function."""
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTRUCTION.match, sass.splitlines()) if m]
    loops = []
    for address, text in code:
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < address:
            loops.append((int(m.group(1), 16), address))
    inner = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    return sorted(sum(1 for x, t in code if a <= x <= b and "LDG" in t) for a, b in inner)


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = np.dtype(args.dtype)
    shapes = [tuple(int(k) for k in s.split("x")) for s in filter(None, args.shapes.split(","))]
    lines = instantiations([s.strip() for s in args.cols.split(",")], dtype, shapes)
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        src.write_text('#include "multireduce/reduce.cuh"\n' + "\n".join(lines) + "\n")
        build = subprocess.run(
            [args.nvcc, "-std=c++17", f"-arch={args.arch}", "-cubin", f"-I{_kernels.kernel_dir()}",
             "-Xptxas", "-v", "-o", str(cubin), str(src)],
            capture_output=True, text=True,
        )  # fmt: skip
        if build.returncode != 0:
            sys.stderr.write(build.stderr)
            return build.returncode
        regs, entry = {}, None
        for line in build.stderr.splitlines():
            if m := _ENTRY.search(line):
                entry = m.group(1)
            elif (m := _REGS.search(line)) and entry:
                regs[entry], entry = int(m.group(1)), None
        dump = subprocess.run([args.cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True)
    for function in dump.stdout.split("\t\tFunction : ")[1:]:
        name = function.split("\n", 1)[0].strip()
        m = re.search(r"NS_\d+(\w+?)ELi(\d+)ELi(\d+)E", name)
        block = int(m.group(2))
        per_sm = min(65536 // (regs[name] * block), 2048 // block)
        print(
            f"{m.group(1):<14} {block}x{m.group(3):<3} {regs[name]:4d} registers, {per_sm} blocks/SM, "
            f"LDGs per innermost loop {loop_loads(function)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
