"""Every top hint the carver gives for a few shapes compiles for sm_90a, and lowers as the carver assumed.

Compile-only (nvcc, no GPU): 28 compiles of 2-6 s each. Beyond "it compiles", each kernel is checked
against the carver's lowering model: wgmma vs mma.sync, a TMA producer warpgroup (warp specialization)
or not, the launched thread count, and no register spills (read from the cubin inside the compiled
library). The kernel is ``templates.matmul.kernel``, the project's GEMM template, which builds the
measured grids' exact program for the default layout.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from carver import MatmulTemplate

pytestmark = pytest.mark.nvcc

# (name, M, N, K, template kwargs, how many hints) -- 8 + 8 + 8 + 4 = 28 compiles
CASES = [
    ("square-fp16", 4096, 4096, 4096, {}, 8),
    ("odd-bf16-cp.async", 4097, 4097, 4097, dict(in_dtype="bfloat16", out_dtype="bfloat16"), 8),
    ("small-M-fp16", 64, 4096, 4096, {}, 8),
    ("fp8", 4096, 4096, 4096, dict(in_dtype="float8_e4m3", out_dtype="float16"), 4),
]


def _hint_params() -> list:
    params = []
    for name, M, N, K, kw, k in CASES:
        tmpl = MatmulTemplate(M, N, K, **kw).with_arch("H100")
        for i, h in enumerate(tmpl.recommend_hints(topk=k)):
            params.append(pytest.param(M, N, K, kw, h, id=f"{name}-{i + 1}-{str(h).split(' ~')[0]}"))
    return params


def _cubin_resources(library: str) -> dict[str, int]:
    """Registers and stack frame of the kernel, from the CUDA ELF (e_machine 190) embedded in the .so."""
    blob = Path(library).read_bytes()
    start = blob.find(b"\x7fELF", 1)
    while start != -1 and struct.unpack_from("<H", blob, start + 0x12)[0] != 190:
        start = blob.find(b"\x7fELF", start + 1)
    if start == -1:
        return {}
    shoff, = struct.unpack_from("<Q", blob, start + 0x28)
    entsize, count, names = struct.unpack_from("<HHH", blob, start + 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", blob, start + shoff + i * entsize) for i in range(count)]
    strtab = start + secs[names][4]
    out: dict[str, int] = {}
    for sec in secs:
        if blob[strtab + sec[0]: blob.index(b"\0", strtab + sec[0])] != b".nv.info":
            continue
        p, end = start + sec[4], start + sec[4] + sec[5]
        while p < end:
            fmt, attr = blob[p], blob[p + 1]
            p += 2
            if fmt == 4:  # attribute with a size and a payload
                size, = struct.unpack_from("<H", blob, p)
                p += 2
                if attr == 0x2F:  # EIATTR_REGCOUNT: (function, registers)
                    out["regs"] = struct.unpack_from("<II", blob, p)[1]
                elif attr == 0x11:  # EIATTR_FRAME_SIZE: (function, bytes of local stack)
                    out["frame"] = struct.unpack_from("<II", blob, p)[1]
                p += size
            elif fmt == 3:
                p += 2
            elif fmt == 2:
                p += 1
    return out


@pytest.fixture(scope="module")
def sm90a():
    import tilelang  # noqa: F401 - puts its bundled tvm on the path
    from tvm.target import Target

    return Target({"kind": "cuda", "arch": "sm_90a"})


@pytest.mark.parametrize("M,N,K,kw,hint", _hint_params())
def test_hint_compiles_as_modelled(M, N, K, kw, hint, sm90a):
    import tilelang

    from templates.matmul import kernel

    cfg = hint.to_config()
    jit = tilelang.compile(kernel(M, N, K, **cfg, **kw), out_idx=[-1], target=sm90a)
    src = jit.get_kernel_source()
    pred = hint.prediction
    assert ("wgmma" in src) == (pred.instruction == "wgmma"), f"{cfg}: instruction is not {pred.instruction}"
    assert ("warpgroup_reg_alloc" in src) == pred.warp_specialized, f"{cfg}: warp specialization differs"
    launch = [int(x) for x in re.findall(r"__launch_bounds__\((\d+)", src)]
    expected = cfg["thread_num"] + (128 if pred.warp_specialized else 0)
    assert launch and launch[0] == expected, f"{cfg}: launches {launch}, the carver assumed {expected}"
    library = getattr(jit.adapter, "libpath", None)
    res = _cubin_resources(library) if library and Path(library).exists() else {}
    if res:
        assert res.get("frame", 0) == 0, f"{cfg}: {res['frame']} bytes of register spills ({res})"
