"""Generate inputs, run a candidate with NaN-poisoned outputs, and compare it with the reference.

The check is strict by default (``max_mismatched_ratio=0``): a kernel that is wrong on one element
in a million is wrong. Outputs start as NaN (or, for integer outputs, a sentinel), so an element a
kernel forgot to write shows up as a mismatch rather than as stale zeros.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import TuningInputError

__all__ = ["DEFAULT_TOL", "CheckResult", "SupplyType", "check_shared_dims", "compare", "make_args", "manual_check",
           "needs_second_poison", "parse_supply_type", "poison_", "poisoned_allocations", "run_reference",
           "same_bits", "supplied_inputs", "tolerances", "torch_dtype", "unwritten_under_both_poisons"]


class SupplyType(enum.Enum):
    """How inputs are generated. ``AUTO``: normal data for floats, small integers for integer dtypes."""

    AUTO = "auto"
    INTEGER = "integer"
    NORMAL = "normal"
    UNIFORM = "uniform"


def parse_supply_type(value: Any) -> SupplyType:
    """Accept our enum, its name or value, or TileLang's ``TensorSupplyType`` (by member name)."""
    if value is None:
        return SupplyType.AUTO
    if isinstance(value, SupplyType):
        return value
    name = getattr(value, "name", value)  # tilelang.TensorSupplyType.Integer -> "Integer"
    if isinstance(name, str):
        key = name.strip().lower()
        aliases = {"randn": "normal", "int": "integer"}
        key = aliases.get(key, key)
        for member in SupplyType:
            if member.value == key:
                return member
    raise ValueError(
        f"supply_type {value!r} is not supported; use one of {[m.value for m in SupplyType]} "
        "(or tilelang.TensorSupplyType.Integer/Uniform/Normal/Randn/Auto)"
    )


def torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype)
    table = {"float": "float32", "half": "float16", "bool": "bool"}
    name = table.get(name, name)
    if name.startswith("float8_e4m3"):
        return torch.float8_e4m3fn
    if name.startswith("float8_e5m2"):
        return torch.float8_e5m2
    try:
        return getattr(torch, name)
    except AttributeError:
        raise ValueError(f"kernel parameter dtype {dtype!r} has no torch equivalent") from None


def _concrete_shape(shape: Sequence[Any], i: int) -> list[int]:
    out = []
    for s in shape:
        try:
            out.append(int(s))
        except (TypeError, ValueError):
            raise ValueError(
                f"kernel parameter {i} has a symbolic shape {list(shape)}; the tuner needs concrete "
                "shapes to generate inputs: bind them in the kernel (e.g. M=4096) before tuning"
            ) from None
    return out


def _fill(shape: list[int], dtype: Any, supply: SupplyType, device: str, gen: Any) -> Any:
    import torch

    is_float = dtype.is_floating_point
    if not is_float or supply is SupplyType.INTEGER:
        lo, hi = (0, 2) if dtype == torch.bool else ((-2, 3) if dtype.is_signed or is_float else (0, 4))
        t = torch.randint(lo, hi, shape, generator=gen, device=device, dtype=torch.int64)
    elif supply is SupplyType.UNIFORM:
        t = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) * 2 - 1
    else:
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return t.to(dtype=dtype, device=device)


def poison_(t: Any, second: bool = False) -> Any:
    """Fill an output buffer in place with a poison value, so that an element the kernel never writes
    fails the check: NaN for floats, the minimum for integers, False for bools; ``second``: +inf, the
    maximum, True. Where the correct value can be the first poison (any integer or bool output, a float
    reference holding NaN), the candidate is checked again with the second (:func:`needs_second_poison`)."""
    import torch

    if t.is_floating_point():
        return t.fill_(float("inf") if second else float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(second)
    info = torch.iinfo(t.dtype)
    return t.fill_(info.max if second else info.min)


@contextlib.contextmanager
def poisoned_allocations(outputs: Sequence[tuple[Sequence[int], Any]], device: str,
                         second: bool = False) -> Iterator[Callable[[Sequence[Any]], bool]]:
    """Have the buffers a kernel's launcher allocates for its outputs (TileLang's ``out_idx``, called with the
    inputs only) start as poison (:func:`poison_`), as a tuning check's outputs do: ``torch.empty`` hands
    back memory as it was freed, and memory the reference just freed can hold the right answer, where a kernel
    that leaves elements unwritten would pass. ``outputs``: each output's shape and torch dtype, in the
    kernel's parameter order.

    Inside the block, ``torch.empty`` fills what it returns with poison (TileLang's Cython and torch
    launchers allocate through it), and on a GPU every allocation of this thread comes from a private memory
    pool whose only free blocks are poisoned ones of the outputs' sizes, made and freed in that order just
    before (a launcher that allocates in C++, TVM-FFI's callee-allocated outputs, gets those). Yields
    ``verified(outs)``: whether each of ``outs`` is memory that started as poison."""
    import torch

    made: set[int] = set()
    real = torch.empty

    def empty(*args: Any, **kwargs: Any) -> Any:
        t = real(*args, **kwargs)
        if t.numel():
            poison_(t, second)
            made.add(t.data_ptr())
        return t

    def verified(outs: Sequence[Any]) -> bool:
        return all(isinstance(o, torch.Tensor) and o.data_ptr() in made for o in outs)

    with contextlib.ExitStack() as stack:
        if device == "cuda" and hasattr(torch.cuda, "MemPool"):
            pool = torch.cuda.MemPool()
            stack.enter_context(torch.cuda.use_mem_pool(pool))
            baits = [poison_(real(tuple(shape), dtype=dtype, device="cuda"), second) for shape, dtype in outputs]
            made.update(b.data_ptr() for b in baits if b.numel())
            del baits  # back to the pool, poisoned: the launcher's allocations of these sizes get them
        torch.empty = empty
        try:
            yield verified
        finally:
            torch.empty = real


def needs_second_poison(outputs: Sequence[Any], refs: Sequence[Any] | None) -> bool:
    """Whether an unwritten element could pass a check against the first poison: an integer or bool output
    (0 is unsigned integers' minimum, False a bool's), or a float output whose reference holds NaN."""
    import torch

    for j, o in enumerate(outputs):
        if not o.is_floating_point():
            return True
        r = refs[j] if refs is not None and j < len(refs) else None
        if isinstance(r, torch.Tensor) and r.is_floating_point() and bool(torch.isnan(r).any()):
            return True
    return False


def unwritten_under_both_poisons(first: Sequence[Any], second: Sequence[Any]) -> str | None:
    """Why a candidate's outputs were not all written, from copies of them after a run on the first poison
    (``first``) and the outputs after a run on the second (:func:`poison_`): an element that held the first
    poison after one run and the second after the other was never written. For outputs checked without a
    reference, where a poison value (an integer's minimum, False) could be a right answer."""
    import torch

    for j, (a, b) in enumerate(zip(first, second)):
        if a is None or a.is_floating_point():  # floats: the NaN check covers them
            continue
        p1, p2 = poison_(torch.empty(1, dtype=a.dtype, device=a.device)), poison_(
            torch.empty(1, dtype=b.dtype, device=b.device), second=True)
        never = (a == p1) & (b == p2)
        if bool(never.any()):
            return f"output {j}: {int(never.sum())} elements still hold the poison under both runs (never written)"
    return None


def check_shared_dims(params: Sequence[Any], args: Sequence[Any]) -> None:
    """Raise ``ValueError`` where two tensors disagree on a dimension their parameters share by name (a
    symbolic ``M``): TileLang's CUDA host code checks that, its C-target adapter binds ``M`` from the first
    tensor and reads past the end of a shorter one. Static dimensions are left to TileLang, which checks them."""
    seen: dict[str, tuple[int, int, int]] = {}
    for i, (p, a) in enumerate(zip(params, args)):
        shape = getattr(a, "shape", None)
        if shape is None:
            continue
        for d, dim in enumerate(p.shape):
            if isinstance(dim, int) or hasattr(dim, "value") or d >= len(shape):
                continue  # static (a Python or TVM integer), or a rank TileLang will refuse
            name = str(dim)
            if name in seen and seen[name][0] != int(shape[d]):
                size, j, e = seen[name]
                raise ValueError(f"argument {i} has {shape[d]} in dimension {d} and argument {j} {size} in dimension "
                                 f"{e}, and the kernel gives both the one size {name}; pass tensors that agree on it")
            seen.setdefault(name, (int(shape[d]), i, d))


def make_args(params: Sequence[Any], out_idx: list[int], supply: SupplyType, device: str,
              seed: int = 0) -> list[Any]:
    """One tensor per kernel parameter: generated inputs, poisoned outputs (at ``out_idx``)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)  # made where they are used: no host copy
    args = []
    for i, p in enumerate(params):
        dtype = torch_dtype(p.dtype)
        shape = _concrete_shape(p.shape, i)
        if i in out_idx:
            args.append(poison_(torch.empty(shape, dtype=dtype, device=device)))
        else:
            args.append(_fill(shape, dtype, supply, device, gen))
    return args


def supplied_inputs(supply_prog: Callable[..., Any], params: Sequence[Any], device: str) -> list[Any]:
    """The inputs a user's ``supply_prog`` makes, as TileLang calls it: with the kernel's input
    parameters (``KernelParam``: ``.shape``, ``.dtype``), returning one tensor per input, in order.
    The inputs of ``set_autotune_inputs`` (:mod:`.capture`) come through here too.

    What it returns must match the kernel: anything else is a :class:`TuningInputError` naming the
    input, raised once, before any candidate is judged on it.
    """
    import torch

    from .capture import AutotuneInputs

    name = getattr(supply_prog, "__qualname__", None) or repr(supply_prog)
    who, verb = ((AutotuneInputs.source, "pass") if isinstance(supply_prog, AutotuneInputs)
                 else (f"supply_prog {name} returned", "return"))
    try:
        got = supply_prog(list(params))
    except Exception as e:  # noqa: BLE001 - the user's supply program: re-raised as what it is
        raise TuningInputError(f"supply_prog {name} raised {type(e).__name__}: {e}") from e
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    if len(got) != len(params):
        raise TuningInputError(f"{who} {len(got)} tensors, the kernel has {len(params)} inputs (every argument "
                               f"but the outputs at out_idx); {verb} one per input, in order")
    for j, (t, p) in enumerate(zip(got, params)):
        want_shape, want_dtype = tuple(_concrete_shape(p.shape, j)), torch_dtype(p.dtype)
        if not isinstance(t, torch.Tensor):
            raise TuningInputError(f"{who} a {type(t).__name__} for input {j}; {verb} tensors")
        if tuple(t.shape) != want_shape or t.dtype != want_dtype or t.device.type != device:
            raise TuningInputError(f"{who} input {j} as {tuple(t.shape)} {t.dtype} on {t.device.type}; "
                                   f"the kernel takes {want_shape} {want_dtype} on {device}")
    return got


def manual_check(manual_check_prog: Callable[..., Any], outputs: list[Any], refs: list[Any]) -> str | None:
    """TileLang's ``manual_check_prog(outputs, refs)``: it raises (an ``assert``) or returns ``False``
    when the outputs are wrong. ``None`` when they pass, else why not. An element the kernel never
    wrote (still NaN where the reference is not) fails before the user's check is asked."""
    import torch

    for j, (o, r) in enumerate(zip(outputs, refs)):
        if o.is_floating_point() and isinstance(r, torch.Tensor) and tuple(r.shape) == tuple(o.shape):
            unwritten = torch.isnan(o) & ~torch.isnan(r.to(o.device))
            if bool(unwritten.any()):
                return f"output {j}: {int(unwritten.sum())} elements still hold NaN poison (never written)"
    try:
        verdict = manual_check_prog(outputs, refs)
        if verdict is None or bool(verdict):  # a falsy verdict of any type fails: torch.all(...), numpy.bool_
            return None
    except Exception as e:  # noqa: BLE001 - the user's check failing (or no truth value) is the verdict
        return f"manual_check_prog rejected the outputs: {type(e).__name__}: {e}"
    return f"manual_check_prog returned {verdict!r}"


#: The tolerance an unset ``atol``/``rtol`` stands for (TileLang's default); see :func:`tolerances`.
DEFAULT_TOL = 1e-2


def tolerances(output: Any, ref: Any, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The ``(atol, rtol)`` an output is compared with. Given values are used as given. Left unset (``None``):

    * integer and bool outputs must equal the reference (0, 0): a tolerance of 1e-2 + 1e-2*|ref| passes
      5005 for 5000;
    * floating outputs get ``rtol`` = :data:`DEFAULT_TOL` and ``atol`` = :data:`DEFAULT_TOL`, lowered for
      outputs much smaller than it (a kernel writing zeros passed against a reference of 1e-3 values) to a
      fraction of the reference's largest finite magnitude: 1e-2 of it for 32-bit and wider outputs, 1e-1
      for narrower ones, whose own rounding (bf16 attention: P rounded before ``P V``) is a larger share of
      a small output (1e-2 of it rejected correct bf16 attention at 4k keys)."""
    import torch

    if not output.is_floating_point() and not output.is_complex():
        if atol is None and rtol is None:
            return 0.0, 0.0
        return float(atol or 0.0), float(rtol or 0.0)
    if atol is None:
        finite = ref[torch.isfinite(ref)] if ref.numel() else ref
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        share = DEFAULT_TOL if output.element_size() >= 4 else 10 * DEFAULT_TOL
        atol = min(DEFAULT_TOL, share * scale)
    return float(atol), float(DEFAULT_TOL if rtol is None else rtol)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    mismatched: int
    total: int
    detail: str


def compare(outputs: Sequence[Any], refs: Sequence[Any], atol: float | None, rtol: float | None,
            max_mismatched_ratio: float) -> CheckResult:
    """Element-wise ``|out - ref| <= atol + rtol*|ref|`` where the reference is finite; where it is not,
    only the same value passes (an infinity of the same sign; NaN where the reference has NaN), as in
    ``torch.isclose``. NaN in the output passes nowhere else. ``atol``/``rtol`` left ``None`` are set per
    output (:func:`tolerances`). ``max_mismatched_ratio`` bounds each output's share of failing elements
    (pooled over all outputs, a small wrong output would hide behind a large right one)."""
    import torch

    if len(outputs) != len(refs):
        return CheckResult(False, 0, 0, f"kernel has {len(outputs)} outputs but ref_prog returned {len(refs)}")
    bad = total = 0
    ok = True
    worst = []
    for j, (o, r) in enumerate(zip(outputs, refs)):
        if not isinstance(r, torch.Tensor):
            r = torch.as_tensor(r)
        if tuple(o.shape) != tuple(r.shape):
            return CheckResult(False, 0, 0, f"output {j} has shape {tuple(o.shape)}, reference {tuple(r.shape)}")
        # compare where the output lives (a GEMM output copied to the host would dominate the check)
        wide = torch.float64 if o.device.type == "cpu" else torch.float32
        of = o.detach().to(dtype=wide)
        rf = r.detach().to(device=o.device, dtype=wide)
        a, rt = tolerances(o, rf, atol, rtol)
        diff = (of - rf).abs()
        tol = a + rt * rf.abs()  # infinite where the reference is: only equality may pass there
        mism = ~((of == rf) | (torch.isfinite(rf) & (diff <= tol)))  # NaN compares False: a mismatch
        mism &= ~(torch.isnan(of) & torch.isnan(rf))  # both NaN: the reference agrees
        n = int(mism.sum())
        bad += n
        total += mism.numel()
        if n and not n <= max_mismatched_ratio * mism.numel():
            ok = False
        if n:
            nan = int(torch.isnan(of).sum())
            finite = diff[~torch.isnan(diff)]
            msg = f"output {j}: {n}/{mism.numel()} mismatched"
            if finite.numel():
                msg += f", max |diff| {float(finite.max()):.4g}"
            if nan:
                msg += f", {nan} NaN (never written, or the kernel produced NaN)"
            ref_nan = int(torch.isnan(rf).sum())
            if ref_nan:
                msg += f", the reference holds {ref_nan} NaN"
            worst.append(msg + f" (atol={a:g}, rtol={rt:g})")
    detail = "; ".join(worst) + (f" (allowed ratio per output {max_mismatched_ratio:g})" if worst else "")
    return CheckResult(ok, bad, total, detail)


def run_reference(ref_prog: Callable[..., Any], inputs: Sequence[Any], n_outputs: int,
                  out_shapes: Sequence[Sequence[int]]) -> list[Any]:
    """Call ``ref_prog`` on ``inputs`` and return its outputs as a list.

    A reference that raises, returns ``None``, or returns a different number or shape of outputs than
    the kernel has, or a floating output with no finite value (all NaN: every NaN-producing kernel would
    match it, and no other), is the problem's fault, not any candidate's: that is a
    :class:`TuningInputError` naming the reference.
    """
    name = getattr(ref_prog, "__qualname__", None) or repr(ref_prog)
    shapes = [tuple(getattr(a, "shape", ())) for a in inputs]
    try:
        out = ref_prog(*inputs)
    except Exception as e:  # noqa: BLE001 - the user's reference: re-raised as what it is
        raise TuningInputError(
            f"the reference program {name} raised {type(e).__name__}: {e} (called with {len(inputs)} inputs of "
            f"shapes {shapes}); fix ref_prog, or check out_idx: the reference gets every non-output argument"
        ) from e
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if out is None or any(o is None for o in outs):
        raise TuningInputError(f"the reference program {name} returned None; it must return the kernel's output "
                               f"tensor(s) ({n_outputs} for out_idx), e.g. `return A + B`")
    if len(outs) != n_outputs:
        raise TuningInputError(f"the reference program {name} returned {len(outs)} outputs, the kernel has "
                               f"{n_outputs} (out_idx); return one tensor per output, in out_idx order")
    for j, (o, shape) in enumerate(zip(outs, out_shapes)):
        got = tuple(getattr(o, "shape", ()))
        if got != tuple(shape):
            raise TuningInputError(f"the reference program {name} returned output {j} of shape {got}, the kernel's "
                                   f"output has shape {tuple(shape)}; fix ref_prog or out_idx")
    _check_reference_values(name, outs)
    return outs


def _check_reference_values(name: str, outs: Sequence[Any]) -> None:
    """See :func:`run_reference`: a reference whose outputs cannot tell a right kernel from a wrong one."""
    import torch

    for j, o in enumerate(outs):
        t = o if isinstance(o, torch.Tensor) else torch.as_tensor(o)
        if t.is_floating_point() and t.element_size() == 1:  # float8: torch has no isfinite for it
            t = t.float()
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).any()):
            what = "NaN" if bool(torch.isnan(t).all()) else "NaN or infinite"
            raise TuningInputError(
                f"the reference program {name} returned output {j} with every element {what}: no kernel can be "
                f"checked against it (a kernel producing NaN would pass); fix ref_prog, or pass skip_check=True")


def same_bits(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same bits (NaN equal to the same NaN, -0.0 unequal to 0.0)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    width = ints.get(a.element_size())
    if width is None:  # complex128 and the like: compare as numbers
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.contiguous().view(width), b.contiguous().view(width)))
