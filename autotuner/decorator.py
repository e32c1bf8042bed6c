"""TileLang's decorator form of autotuning, on tilecarve's AutoTuner:

    @autotune(configs=get_configs(), warmup=3, rep=20, ref_prog=ref_program)
    @tilelang.jit(out_idx=[-1])
    def matmul(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=2, thread_num=128):
        ...
        return main                      # a T.prim_func

    kernel = matmul(4096, 4096, 4096)    # tunes over the configs once per shape; the best kernel

The call's arguments bind the factory (``functools.partial``) and each config fills the rest, as
in TileLang; ``out_idx``, ``target`` and ``pass_configs`` come from ``tilelang.jit``. A call that
already gives a tunable parameter skips tuning and compiles with TileLang's ``jit``, as TileLang
does. Results are kept per call arguments (and ``set_autotune_inputs`` context) in the process, and
in the tuning database across runs. Reached as ``tilelang.autotune`` through :mod:`tilecarve.tilelang`
too. TileLang's eager-style kernels (tensors as arguments) are compiled with fixed tunables, not tuned.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from .capture import AutotuneInputs, active_inputs
from .compile import tl_compile
from .config import PASS_CONFIGS_KEY
from .scratch import positions
from .served import ServedKernel, check_args, on_device
from .tuner import AutoTuner

__all__ = ["AutoTuneImpl", "autotune"]

logger = logging.getLogger(__name__)


class AutoTuneImpl:
    """What ``@autotune(...)`` makes of a ``tilelang.jit`` kernel factory; call it with the shape arguments."""

    def __init__(self, jit_impl: Any, configs: Any, profile: dict[str, Any], warmup: int, rep: int,
                 timeout: float | None) -> None:
        func = getattr(getattr(jit_impl, "func", None), "orig_func", None)
        if func is None or not hasattr(jit_impl, "out_idx"):
            raise TypeError(f"@autotune(...) must be stacked on a @tilelang.jit(out_idx=...) kernel factory, got "
                            f"{jit_impl!r}: put @tilelang.jit(...) between @autotune(...) and the def")
        self.jit_impl, self.factory = jit_impl, func
        self.configs, self.profile = configs, profile
        self.warmup, self.rep, self.timeout = warmup, rep, timeout
        self._tuned: dict[Any, Any] = {}  # tuned kernels, and the served ones of untuned calls
        functools.update_wrapper(self, func)

    def _tunable(self, configs: list[dict[str, Any]]) -> set[str]:
        return {k for c in configs for k in c if k != PASS_CONFIGS_KEY}

    def _given(self, args: tuple, kwargs: dict[str, Any], tunable: set[str]) -> list[str]:
        """Tunable parameters the call already fixes (positionally or by keyword)."""
        bound = inspect.signature(self.factory).bind_partial(*args, **kwargs).arguments
        return sorted(tunable & set(bound))

    def _configs(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """This call's configs (``configs`` may be a callable taking the call's arguments: called once)."""
        return list(self.configs(*args, **kwargs)) if callable(self.configs) else self.configs

    def tuner(self, *args: Any, **kwargs: Any) -> AutoTuner:
        """The :class:`AutoTuner` one call would run (for ``set_tuning``, say), not yet run."""
        return self._tuner(args, kwargs, self._configs(args, kwargs))

    def _tuner(self, args: tuple, kwargs: dict[str, Any], configs: Any) -> AutoTuner:
        kernel = functools.partial(self.factory, *args, **kwargs)
        jit = self.jit_impl
        unsupported = {k: v for k in ("compile_flags", "debug_root_path") if (v := getattr(jit, k, None))}
        if unsupported:
            raise NotImplementedError(
                f"@tilelang.jit({', '.join(f'{k}={v!r}' for k, v in unsupported.items())}): tilecarve compiles every "
                "candidate with TileLang's defaults and would not apply them; drop them from @tilelang.jit to tune "
                "here, or tune with TileLang's own tilelang.autotune")
        return (AutoTuner.from_kernel(kernel=kernel, configs=configs)
                .set_compile_args(out_idx=jit.out_idx, target=jit.target,
                                  execution_backend=getattr(jit, "execution_backend", None),
                                  target_host=getattr(jit, "target_host", None), pass_configs=jit.pass_configs)
                .set_profile_args(warmup=self.warmup, rep=self.rep, timeout=self.timeout, **self.profile))

    def _eager(self, kwargs: dict[str, Any], tunable: set[str]) -> bool:
        """Whether the factory is TileLang's eager style (tensors as arguments, ``T.const``/``T.empty``),
        which tilecarve compiles with ``tilelang.jit`` when the call fixes the tunables and refuses to tune."""
        jit = self.jit_impl  # tensors annotated in the body (T.Tensor) make a kernel eager; nothing is elaborated
        if not getattr(jit.func, "tensor_args", None) and getattr(jit, "mode", None) != "eager":
            return False
        if not tunable & set(kwargs):
            name = getattr(self.factory, "__qualname__", self.factory)
            raise NotImplementedError(
                f"{name} is a TileLang eager-style kernel (tensors as arguments, T.const/T.empty): tilecarve tunes "
                "factories that return a T.prim_func (def f(M, N, block_M=...): ... return main). Write it that way, "
                f"fix its tunables {sorted(tunable)} in the call, or tune it with TileLang's own tilelang.autotune")
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._serve(args, kwargs, compile_only=False)

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """TileLang's ``.compile(...)``: the tuned kernel (the same as calling a factory; an eager-style
        kernel with its tunables fixed is compiled, not run)."""
        return self._serve(args, kwargs, compile_only=True)

    def _serve(self, args: tuple, kwargs: dict[str, Any], compile_only: bool) -> Any:
        configs = self._configs(args, kwargs)
        tunable = self._tunable(list(configs))
        if self._eager(kwargs, tunable):
            if compile_only:
                return self._served(self.jit_impl.compile(*args, **kwargs))
            # TileLang compiles it and runs it on the call's tensors: checked as a served kernel's are
            logger.info("an eager-style kernel with its tunables given: compiling with tilelang.jit, no tuning")
            # every argument, keywords too, checked by name (autotuner.served); scalars and flags pass
            bound = inspect.signature(self.factory).bind_partial(*args, **kwargs).arguments
            gpu = check_args(list(bound.values()), list(bound))
            return on_device(gpu, self.jit_impl, *args, **kwargs)
        given = self._given(args, kwargs, tunable)
        if given:  # TileLang's way to skip tuning: fix the tunable parameters in the call
            logger.info("tunable parameters %s given in the call: compiling with tilelang.jit, no tuning", given)
            return self._untuned(args, kwargs)
        key = _key(args, kwargs, active_inputs())
        if key is None or key not in self._tuned:
            kernel = self._tuner(args, kwargs, configs).run().kernel
            if key is None:
                return kernel
            self._tuned[key] = kernel
        return self._tuned[key]

    def _served(self, kernel: Any) -> Any:
        """TileLang's compiled ``kernel`` as a :class:`.served.ServedKernel` (its calls check their tensors'
        alignment and keep the caller's GPU), one per kernel."""
        served = self._tuned.get(("served", kernel))
        if served is None:
            served = self._tuned["served", kernel] = ServedKernel(kernel)
        return served

    def _untuned(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``tilelang.jit``'s kernel for a call that fixes the tunables, as a :class:`.served.ServedKernel`;
        one with scratch parameters
        (:mod:`.scratch`) compiled again so that it allocates them itself, as the tuned kernel does
        (``tilelang.jit`` would take them for inputs), once per call signature."""
        kernel = self.jit_impl(*args, **kwargs)
        if not positions(kernel):
            return self._served(kernel)
        key = _key(args, kwargs, None)
        if key is None or ("untuned", key) not in self._tuned:
            served = tl_compile(kernel.prim_func, kernel.target, kernel.pass_configs or None,
                                out_idx=self.jit_impl.out_idx, serve=True)
            if key is None:
                return served
            self._tuned["untuned", key] = served
        return self._tuned["untuned", key]


def _key(args: tuple, kwargs: dict[str, Any], inputs: AutotuneInputs | None) -> Any:
    """The in-process memo key: the call's arguments and the ``set_autotune_inputs`` in effect."""
    try:
        key = (args, tuple(sorted(kwargs.items())), inputs)
        hash(key)
        return key
    except TypeError:  # an unhashable argument: no in-process memo (the tuning database still serves it)
        return None


def autotune(func: Callable[..., Any] | None = None, *, configs: Any, warmup: int = 25, rep: int = 100,
             timeout: float | None = 100, supply_type: Any = None, ref_prog: Callable[..., Any] | None = None,
             supply_prog: Callable[..., Any] | None = None, rtol: float | None = None,
             atol: float | None = None, max_mismatched_ratio: float = 0.0, skip_check: bool = False,
             manual_check_prog: Callable[..., Any] | None = None, cache_input_tensors: bool = False,
             do_not_specialize: Any = None, early_stop: bool = False,
             early_stop_factor: float = 2.0) -> Callable[[Any], AutoTuneImpl]:
    """TileLang's ``tilelang.autotune`` signature. ``configs``: a list of dicts, or a callable taking
    the call's arguments and returning one. ``warmup``/``rep`` are numbers of calls (as in TileLang),
    ``timeout`` the compile timeout in seconds. The check arguments mean what they mean in
    :meth:`AutoTuner.set_profile_args`; ``max_mismatched_ratio`` defaults to 0 (TileLang: 0.01),
    tilecarve's strict check. ``do_not_specialize``, ``early_stop`` and ``early_stop_factor`` are
    accepted and have no effect: every candidate is timed in full, and every argument keys the result.
    """
    if func is not None:
        raise ValueError("use @autotune(configs=...) with arguments, stacked on @tilelang.jit(...)")
    profile = dict(supply_type=supply_type, ref_prog=ref_prog, supply_prog=supply_prog, rtol=rtol, atol=atol,
                   max_mismatched_ratio=max_mismatched_ratio, skip_check=skip_check,
                   manual_check_prog=manual_check_prog, cache_input_tensors=cache_input_tensors)
    if early_stop_factor < 1.0:
        raise ValueError(f"early_stop_factor must be >= 1.0, got {early_stop_factor!r}")
    del do_not_specialize, early_stop  # accepted for TileLang's signature; see the docstring

    def decorator(jit_impl: Any) -> AutoTuneImpl:
        return AutoTuneImpl(jit_impl, configs, profile, warmup, rep, timeout)

    return decorator
