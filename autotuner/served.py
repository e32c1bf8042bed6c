"""The kernels tilecarve hands out, and what each call checks before it launches one.

TileLang's host code checks a tensor's rank, shape, strides, dtype and device, but neither of two
things that a served kernel must still get right:

* **Where the data starts.** Its kernels load 16-byte pieces (TMA, ``cp.async``, vectorised copies) and
  take every buffer to start on a 16-byte boundary, as torch's allocations do. A view at an offset
  (``x.view(-1)[1:]``, a column slice of a row-major tensor) passes every check, and the kernel then
  faults with a misaligned address, which ends the process's CUDA context: every later CUDA call of the
  process fails. :func:`launch` refuses such a tensor with a ``ValueError`` that names it.
* **The current device.** The host code makes the tensors' GPU current (``cudaSetDevice``) and leaves it
  so: a call with tensors on ``cuda:1`` from a thread whose current device is ``cuda:0`` left it on
  ``cuda:1``, and the caller's next ``torch.empty(..., device="cuda")`` landed there. :func:`launch` runs
  such a call under ``torch.cuda.device`` so that the current device is the caller's again after it.

Every kernel tilecarve serves goes through :func:`launch`: a tuned kernel (:class:`.tuner.TunedKernel`),
and every :class:`ServedKernel`, which is what a template's ``compile``, a keyed kernel and the
decorator's untuned path return. Candidates being measured do not: the measuring side makes their
buffers itself, and a check on its timed path would be timed with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .bench import param_names

__all__ = ["ALIGN", "ServedKernel", "check_args", "launch", "on_device"]

#: The byte boundary every tensor a served kernel takes must start on.
ALIGN = 16

_SEVERAL_GPUS: list[bool] = []  # computed once: whether this process sees more than one GPU


def _several_gpus() -> bool:
    if not _SEVERAL_GPUS:
        import torch

        _SEVERAL_GPUS.append(torch.cuda.is_available() and torch.cuda.device_count() > 1)
    return _SEVERAL_GPUS[0]


def check_args(args: Sequence[Any], names: Sequence[str] = (), buffers: Sequence[bool] = ()) -> int | None:
    """Refuse a tensor among ``args`` that does not start on a 16-byte boundary, and a non-tensor where
    ``buffers[i]`` says the kernel takes a buffer (TileLang's C-target adapter crashes the process on
    ``None`` or a number there); ``names``: the arguments' names, for the messages. Returns the GPU of the
    first CUDA tensor, or ``None``."""
    import torch

    dev = None
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.data_ptr() % ALIGN:
                raise ValueError(_misaligned(i, names, a))
            if dev is None and a.is_cuda:
                dev = a.device.index
        elif i < len(buffers) and buffers[i]:
            raise TypeError(f"argument {i} {_label(i, names)}is {type(a).__name__} ({a!r:.60}), not a torch.Tensor; "
                            f"the kernel takes a tensor there")
    return dev


def _label(i: int, names: Sequence[str]) -> str:
    return f"{names[i]!r} " if i < len(names) else ""


def _misaligned(i: int, names: Sequence[str], a: Any) -> str:
    off = a.data_ptr() % ALIGN
    by_view = a.storage_offset() and (a.storage_offset() * a.element_size()) % ALIGN == off
    where = (f"a view {a.storage_offset()} elements into its storage" if by_view
             else "its memory itself starts there (not a view of torch's allocation)")
    gpu = ", and on a GPU that ends the process's CUDA context" if a.is_cuda else ""
    return (f"argument {i} {_label(i, names)}starts {off} bytes past a {ALIGN}-byte boundary ({where}, shape "
            f"{tuple(a.shape)}): the kernel loads {ALIGN}-byte pieces and needs every tensor to start on such a "
            f"boundary, or it faults{gpu}; pass a copy (.clone()) or a view that starts on one")


def on_device(dev: int | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with GPU ``dev`` current, and the caller's current device restored after it
    (where the process sees more than one GPU, and ``dev`` is not the current one already)."""
    if dev is not None and _several_gpus():
        import torch

        if dev != torch.cuda.current_device():
            with torch.cuda.device(dev):
                return fn(*args, **kwargs)
    return fn(*args, **kwargs)


def launch(fn: Callable[..., Any], args: Sequence[Any], names: Sequence[str] = (),
           buffers: Sequence[bool] = ()) -> Any:
    """``fn(*args)`` for a compiled kernel ``fn``, its arguments checked (:func:`check_args`), on the
    tensors' GPU with the caller's current device restored after it (:func:`on_device`)."""
    return on_device(check_args(args, names, buffers), fn, *args)


def _buffer_mask(jit: Any) -> list[bool]:
    """Per parameter of ``jit``, whether it is a buffer (a tensor) rather than a scalar; empty when unknown."""
    try:
        func = jit.prim_func
        return [p in func.buffer_map for p in func.params]
    except Exception:  # noqa: BLE001 - a kernel object without a PrimFunc: no type check
        return []


class ServedKernel:
    """A TileLang ``JITKernel`` as tilecarve serves it: every call goes through :func:`launch`.

    * ``scratch`` (:mod:`.scratch`): positions the kernel was compiled with in its ``out_idx`` after the
      outputs (TileLang allocates them, through torch, per call). The call returns the outputs alone, and
      ``out_idx`` is the outputs'. Without scratch, ``out_idx`` and the result are the ``JITKernel``'s.
    * ``check_dims``: check that the tensors agree on every dimension their parameters share
      (:func:`.check.check_shared_dims`), for a symbolic-shape kernel compiled for the C target: TileLang's
      CUDA host code checks that itself, its C-target adapter binds each symbolic size from the first tensor
      that has it and reads past the end of a shorter one (C = A @ B with B shorter than A gave garbage).

    Other attributes (``get_kernel_source()``, ``params``...) are the ``JITKernel``'s.
    """

    def __init__(self, jit_kernel: Any, out_idx: Sequence[int] | None = None, scratch: Sequence[int] = (),
                 check_dims: bool = False) -> None:
        from .scratch import input_positions

        self.jit_kernel = jit_kernel
        self.scratch = list(scratch)
        self.out_idx = list(out_idx or []) if self.scratch else jit_kernel.out_idx
        self._device = "cuda" if "cuda" in str(getattr(jit_kernel, "target", "cuda")) else "cpu"
        self._all = param_names(jit_kernel)
        n = len(self._all)
        outs = [int(i) % n for i in (jit_kernel.out_idx or [])] if n else []
        ins = input_positions(n, outs, [])
        self._in = [self._all[i] for i in ins]  # a call passes these alone
        self._buf_all = _buffer_mask(jit_kernel)
        self._buf_in = [self._buf_all[i] for i in ins] if self._buf_all else []
        self._params = list(jit_kernel.params) if check_dims else None
        self._in_params = [self._params[i] for i in ins] if check_dims else None

    def __call__(self, *args: Any) -> Any:
        every = len(args) == len(self._all)
        if self._params is not None:
            from .check import check_shared_dims

            check_shared_dims(self._params if every else self._in_params, args)
        got = launch(self.jit_kernel, args, self._all if every else self._in, self._buf_all if every else self._buf_in)
        return self._outputs(got)

    def launch_checked(self, *args: Any) -> Any:
        """The call, for a caller that has checked the arguments' alignment and made their GPU current (the
        matmul op): the kernel's outputs, its scratch dropped."""
        return self._outputs(self.jit_kernel(*args))

    def _outputs(self, got: Any) -> Any:
        if not self.scratch:
            return got
        n = len(self.out_idx)  # got: [outputs..., scratch...], in out_idx's order
        if n == 0:  # an in-place kernel: TileLang returned the scratch alone
            return None
        return got[0] if n == 1 else list(got[:n])

    def get_profiler(self, tensor_supply_type: Any = None) -> Any:
        """TileLang's profiler for this kernel as it is called. With scratch, inputs are made for the inputs
        only and the outputs (not the scratch) compared (the ``JITKernel``'s own would take the scratch for
        a second output)."""
        if not self.scratch:
            return self.jit_kernel.get_profiler(*(() if tensor_supply_type is None else (tensor_supply_type,)))
        from .profiler import TunedProfiler

        return TunedProfiler.of(self, tensor_supply_type)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "jit_kernel":  # copy/pickle probe a bare instance: no recursion
            raise AttributeError(name)
        return getattr(self.jit_kernel, name)
