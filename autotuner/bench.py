"""The measuring half of tuning: load a compiled candidate, check it, time it.

Two ways to run it, with one interface (``measure``, ``retime``, ``fetch_ref_latency``, ``close``):

* :class:`Bench` measures in this process.
* :class:`IsolatedBench` (the default) runs a ``Bench`` in a spawned process that owns the GPU.
  A kernel that faults leaves a CUDA context unusable for the rest of the process ("sticky"
  errors such as an illegal address), and one that segfaults on the CPU takes its process with
  it. Isolated, that costs one trial (``runtime_error``) and a restart of the measuring process;
  a kernel that runs past ``run_timeout`` is killed (``timeout``). The process starts when
  tuning starts, so its imports overlap with compilation.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .check import SupplyType, compare, make_args, poison_, run_reference
from .compile import (
    ERROR_CHARS,
    _cloudpickle,
    _restore_globals,
    _seed_linecache,
    build,
    kernel_globals,
    kernel_sources,
)
from .config import config_label
from .timing import Timing, time_callable
from .trial import Trial

__all__ = ["Bench", "BenchSpec", "IsolatedBench"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchSpec:
    """Everything the measuring side needs; picklable (cloudpickle) so it can cross processes."""

    kernel: Callable[..., Any]
    target_spec: Any
    device: str  # "cuda" or "cpu"
    pass_configs: dict[str, Any] | None
    out_idx: list[int] | None
    supply_type: SupplyType
    ref_prog: Callable[..., Any] | None
    skip_check: bool
    atol: float
    rtol: float
    max_mismatched_ratio: float
    warmup: int
    rep: int


class TuningInputError(ValueError):
    """Inputs cannot be generated for the kernel's parameters (e.g. symbolic shapes): a user bug."""


class Bench:
    """Measure candidates in this process."""

    def __init__(self, spec: BenchSpec) -> None:
        self.spec = spec
        self._inputs: dict[tuple, tuple[list[Any], list[Any] | None]] = {}
        self._kernels: dict[int, Any] = {}
        self.ref_latency: float | None = None

    def _out_idx(self, n: int) -> list[int]:
        return [i % n for i in (self.spec.out_idx or [])]

    def _args_and_refs(self, jit: Any) -> tuple[list[Any], list[Any] | None]:
        """Inputs (and reference outputs) per distinct parameter signature, made once per run."""
        s = self.spec
        sig = tuple((tuple(map(str, p.shape)), str(p.dtype)) for p in jit.params)
        if sig not in self._inputs:
            out_idx = self._out_idx(len(jit.params))
            try:
                args = make_args(jit.params, out_idx, s.supply_type, s.device)
            except (ValueError, TypeError) as e:
                raise TuningInputError(str(e)) from e
            refs = None
            inputs = [a for i, a in enumerate(args) if i not in out_idx]
            if s.ref_prog is not None:
                refs = run_reference(s.ref_prog, inputs)
                if self.ref_latency is None:
                    ref = s.ref_prog
                    self.ref_latency = time_callable(lambda: ref(*inputs), s.warmup, s.rep, s.device).median_ms
            self._inputs[sig] = (args, refs)
        return self._inputs[sig]

    def measure(self, index: int, cfg: dict[str, Any], compile_s: float | None) -> Trial:
        s = self.spec
        try:
            jit = build(s.kernel, cfg, s.target_spec, s.pass_configs)
        except Exception as e:  # noqa: BLE001 - the worker compiled it; a failure to load is this config's
            return Trial(cfg, "compile_error", f"load after compile failed: {type(e).__name__}: {e}"[-ERROR_CHARS:],
                         compile_s)
        args, refs = self._args_and_refs(jit)
        out_idx = self._out_idx(len(args))
        try:
            for i in out_idx:  # poison again: the last run of another config wrote these
                poison_(args[i])
            jit(*args)
            self._sync()
        except Exception as e:  # noqa: BLE001 - any launch failure is this config's runtime_error
            return Trial(cfg, "runtime_error", f"{type(e).__name__}: {e}"[-ERROR_CHARS:], compile_s)
        why = self._check([args[i] for i in out_idx], refs)
        if why is not None:
            return Trial(cfg, "mismatch", why, compile_s)
        try:
            timing = time_callable(lambda: jit(*args), s.warmup, s.rep, s.device)
        except Exception as e:  # noqa: BLE001
            return Trial(cfg, "runtime_error", f"{type(e).__name__}: {e}"[-ERROR_CHARS:], compile_s)
        self._kernels[index] = jit
        return Trial(cfg, "ok", None, compile_s, timing.median_ms, timing.min_ms, timing.iqr_ms)

    def retime(self, index: int, cfg: dict[str, Any]) -> Timing:
        """Time a measured candidate again (finalists, once compilation no longer loads the CPU).

        After a restart of the measuring process the kernel is loaded again (a disk-cache hit).
        """
        if index not in self._kernels:
            self._kernels[index] = build(self.spec.kernel, cfg, self.spec.target_spec, self.spec.pass_configs)
        jit = self._kernels[index]
        args, _ = self._args_and_refs(jit)
        return time_callable(lambda: jit(*args), self.spec.warmup, self.spec.rep, self.spec.device)

    def has_kernel(self, index: int) -> bool:
        return index in self._kernels

    def kernel(self, index: int) -> Any:
        """The loaded kernel of a measured candidate."""
        return self._kernels[index]

    def fetch_ref_latency(self) -> float | None:
        return self.ref_latency

    def close(self) -> None:
        self._kernels.clear()
        self._inputs.clear()

    def _sync(self) -> None:
        if self.spec.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _check(self, outs: list[Any], refs: list[Any] | None) -> str | None:
        """``None`` when the outputs pass, else why not."""
        import torch

        s = self.spec
        if refs is None or s.skip_check:
            for j, o in enumerate(outs):  # still catch unwritten outputs
                if o.is_floating_point() and bool(torch.isnan(o).any()):
                    return f"output {j} still holds NaN poison: some elements were never written"
            return None
        res = compare(outs, refs, s.atol, s.rtol, s.max_mismatched_ratio)
        return None if res.ok else res.detail


# ---------------------------------------------------------------------------------------------
# isolation


def _serve(fd: int) -> None:
    """Main of the measuring process (``python -c``): one request in, one reply out, over ``fd``."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    blob, glb, sources = conn.recv()
    _seed_linecache(sources)
    spec: BenchSpec = _cloudpickle().loads(blob)
    _restore_globals(spec.kernel, glb)
    bench = Bench(spec)
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg[0]
        try:
            if op == "measure":
                reply = bench.measure(msg[1], msg[2], msg[3])
            elif op == "retime":
                reply = bench.retime(msg[1], msg[2])
            elif op == "ref_latency":
                reply = bench.ref_latency
            else:
                return
            conn.send(("ok", reply))
        except TuningInputError as e:
            conn.send(("input_error", str(e)))


class IsolatedBench:
    """A :class:`Bench` in a spawned process, restarted when a candidate kills it."""

    def __init__(self, spec: BenchSpec, run_timeout: float) -> None:
        self.spec = spec
        self.run_timeout = run_timeout
        self._blob = _cloudpickle().dumps(spec)
        self._glb = kernel_globals(spec.kernel)
        self._sources = kernel_sources(spec.kernel)
        self._proc: Any = None
        self._conn: Any = None
        self.ref_latency: float | None = None
        self._start()

    def _start(self) -> None:
        # A fresh interpreter rather than multiprocessing's spawn, which re-imports the user's
        # __main__ (re-running a script that lacks an `if __name__ == "__main__"` guard).
        parent, child = multiprocessing.Pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from autotuner.bench import _serve; _serve({child.fileno()})"],
            pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL)
        child.close()
        self._conn = parent
        self._conn.send((self._blob, self._glb, self._sources))
        self._ready = False

    def _wait_ready(self) -> None:
        if not self._ready:
            if not self._conn.poll(600):
                raise RuntimeError("the measuring process did not start within 600 s")
            self._conn.recv()  # ("ready", None)
            self._ready = True

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def _call(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        """``("ok", reply)``, ``("input_error", text)``, ``("died", why)`` or ``("timeout", why)``."""
        if self._proc is None:
            self._start()
        try:
            self._wait_ready()
            self._conn.send(msg)
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
        else:
            self._kill()
            return "timeout", f"kernel ran past run_timeout={timeout:g} s; measuring process killed"
        try:
            code = self._proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return "died", (f"the measuring process died ({how}) while running this config: a crash or a sticky "
                        "CUDA error; it was restarted for the remaining configs")

    def measure(self, index: int, cfg: dict[str, Any], compile_s: float | None) -> Trial:
        tag, reply = self._call(("measure", index, cfg, compile_s), self.run_timeout)
        if tag == "ok":
            return reply
        if tag == "input_error":
            raise TuningInputError(f"cannot generate inputs for {config_label(cfg)}: {reply}")
        return Trial(cfg, "runtime_error" if tag == "died" else "timeout", reply, compile_s)

    def retime(self, index: int, cfg: dict[str, Any]) -> Timing | None:
        tag, reply = self._call(("retime", index, cfg), self.run_timeout)
        return reply if tag == "ok" else None

    def fetch_ref_latency(self) -> float | None:
        tag, reply = self._call(("ref_latency",), 60)
        if tag == "ok" and reply is not None:
            self.ref_latency = reply
        return self.ref_latency

    def close(self) -> None:
        if self._proc is not None and self._conn is not None:
            try:
                self._conn.send(("quit",))
            except (BrokenPipeError, OSError):
                pass
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
