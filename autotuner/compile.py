"""Compile candidates in parallel worker processes, each compile in a killable child.

Layout of the work:

* One task per config runs on worker processes: by default a pool forked from the parent (all
  cores), else joblib's ``loky`` or ``dask`` backends, or a Ray cluster's compile hosts (``"ray"``,
  :mod:`.ray_cluster`, which run this same task in a child of a fork server per node). A job
  of many kernels (many keys of a model, :mod:`.job`) goes through one pool, kernel after kernel
  (:func:`compile_many`).
* Inside a task, the compile runs in a forked child that leads its own session (a Ctrl-C meant
  for the terminal's process group does not reach it) and forks the compiler proper. A compile
  that hangs past ``timeout`` is killed with its nvcc grandchildren; one that segfaults is a
  ``compile_error`` with its signal. Either way the worker survives for the next task.
* Nothing outlives the run (:mod:`.procs`): the pool is terminated when the consumer stops early
  (Ctrl-C, an error); a worker that is terminated, or whose parent dies, kills its compile child's
  group first; the group leader kills its group when the worker dies, even of SIGKILL. Each compile
  gets its own temporary directory (inside the run's :func:`.procs.run_scratch` directory when
  there is one), removed when the compile ends, so the ``.cpp``/``.so`` pairs TileLang leaves in
  ``$TMPDIR`` and the scratch of a killed gcc or nvcc are not left behind.
* The child compiles through ``tilelang.compile``, which stores the built library in TileLang's
  disk cache. The parent later calls the same :func:`tl_compile` on the same PrimFunc and gets a
  disk hit: it loads a shared object instead of compiling a second time.
* Workers hide the GPU (``CUDA_VISIBLE_DEVICES=""``) before they import anything heavy: they compile
  for the explicit target the parent resolved, and never create a CUDA context.
* Kernels defined in a notebook cell or a REPL have no file on disk; TileLang reads source through
  ``inspect``, which reads ``linecache``. The parent ships those lines with the job and the worker
  seeds its own ``linecache`` with them.
"""

from __future__ import annotations

import contextlib
import functools
import io
import linecache
import logging
import os
import signal
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import forking, procs
from .cache import prim_hash
from .config import merge_pass_configs, split_config
from .settings import check_setting, resolve_out_idx
from .trial import Status, error_headline, format_error

__all__ = ["CompileBatch", "CompileOutcome", "build", "cloudpickle_module", "compile_all", "compile_in_loky",
           "compile_many", "compile_task", "dump_prim", "elaborate_config", "in_loky_worker",
           "kernel_globals", "kernel_sources", "load_prim", "restore_globals", "seed_linecache", "terminate_pool",
           "tl_compile"]

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class CompileOutcome:
    """What one candidate's compile did."""

    index: int
    status: Status  # OK, COMPILE_ERROR or TIMEOUT
    error: str | None
    seconds: float
    batch: int = 0  # which of compile_many's batches it belongs to
    #: The PrimFunc the compile built, pickled (:func:`dump_prim`), so the measuring side loads the kernel
    #: without elaborating the config again; ``None`` when the compile failed or the PrimFunc did not pickle
    prim: bytes | None = field(default=None, repr=False)


def tl_compile(func: Any, target_spec: Any, pass_configs: dict[str, Any] | None = None,
               out_idx: Sequence[int] | int | None = None, serve: bool = False, check_dims: bool = False) -> Any:
    """The one call that compiles (or loads from TileLang's disk cache) a PrimFunc.

    Workers and the parent must call it with identical arguments so that the parent's call is a
    cache hit. Every argument is explicit. The tuner passes ``out_idx=None`` (it passes outputs itself,
    so it can pre-fill them with NaN; the result wraps the user's ``out_idx``); a served kernel
    (:mod:`.keyed`, a template's ``compile``) names its outputs.

    ``out_idx`` goes to TileLang as a fresh list of non-negative indices. TileLang's cache key includes
    the list as given, and TileLang rewrites negative indices of the list it is given in place: a
    caller's ``[-1]`` passed twice would be keyed ``(-1,)`` the first time and ``(2,)`` after, so that
    a process serving its kernels in another order than the one that compiled them missed the disk
    cache and compiled again (an H200 MLP block's first table-loaded forward: 10 of 12 kernels, 3 s).

    TileLang lowers a copy of ``func``: on a cache miss its lowering renames variables of the function
    it is given in place (the thread index ``tx`` of a kernel without a producer warpgroup becomes
    ``thread_binding``), so the caller's PrimFunc would print, hash and pickle differently after its
    first compile than a fresh elaboration of the same config: the winner's check then flagged a
    factory that does depend on its arguments only (the cp.async GEMV, H200, 2026-11-23), and the
    measuring side, loading the pickled PrimFunc, missed the disk cache and compiled it again.

    ``serve``: the kernel is handed to a user (a template's ``compile``, a keyed kernel, the decorator),
    so it comes back as a :class:`.served.ServedKernel`, whose calls check their tensors' alignment and
    keep the caller's current GPU (``check_dims``: and their shared symbolic sizes, for the C target). A
    PrimFunc with scratch parameters (:mod:`.scratch`) compiled with ``out_idx`` has TileLang allocate
    them too, per call, and comes back as a :class:`.served.ServedKernel` that returns the outputs alone.
    """
    import tilelang

    from .scratch import positions
    from .served import ServedKernel

    scratch: list[int] = []
    if out_idx is not None:
        out_idx = resolve_out_idx([out_idx] if isinstance(out_idx, int) else list(out_idx), len(func.params))
        scratch = positions(func, out_idx)
    jit = tilelang.compile(_private_copy(func), out_idx=None if out_idx is None else out_idx + scratch,
                           target=target_spec, pass_configs=pass_configs)
    if serve or scratch:
        return ServedKernel(jit, out_idx, scratch, check_dims)
    return jit


def _private_copy(func: Any) -> Any:
    """A deep copy of the PrimFunc ``func`` (TVM's JSON form, about 2 ms for a GEMM); ``func`` itself
    when it does not round-trip (then TileLang may rename its variables, as before)."""
    import pickle

    try:
        return pickle.loads(pickle.dumps(func))
    except Exception:  # noqa: BLE001 - not a TVM object that pickles: compile it as given
        return func


@functools.cache
def cloudpickle_module() -> Any:
    """cloudpickle, which pickles notebook and ``__main__`` functions by value (joblib < 1.5 vendors it),
    as an object with its ``dumps`` and ``loads``; ``dumps`` keeps each code object's file name
    (:class:`_KeepFilenames`). One per process: :func:`kernel_globals` and :func:`restore_globals` call it
    once per global."""
    try:
        import cloudpickle
    except ImportError:
        from joblib.externals import cloudpickle
    return _KeepFilenames(cloudpickle)


def _code_with_filename(make: Callable[..., types.CodeType], args: tuple, filename: str) -> types.CodeType:
    """A code object as cloudpickle rebuilds it, with the file name it had where it was pickled."""
    code = make(*args)
    return code if code.co_filename == filename else code.replace(co_filename=filename)


class _KeepFilenames:
    """cloudpickle's ``dumps`` and ``loads``, except that a function pickled by value keeps its code's
    file name. cloudpickle 3.1.3 writes ``"<dynamic-code>"`` instead (a deterministic payload), and then
    ``inspect.getsource`` in the worker, which TileLang reads every kernel through, fails with "could
    not get source code" (CI, 2026-11-28: every kernel that travels by value, a closure's or a decorated
    function's, failed to compile in the workers). With the name back, the worker reads the kernel's file,
    or the lines :func:`seed_linecache` put under that name."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        reduce = getattr(getattr(module, "cloudpickle", module), "_code_reduce", None)

        class Pickler(module.Pickler):
            def reducer_override(self, obj: Any) -> Any:
                if reduce is not None and isinstance(obj, types.CodeType):
                    make, args = reduce(obj)
                    return _code_with_filename, (make, args, obj.co_filename)
                return super().reducer_override(obj)

        self.pickler = Pickler

    def dumps(self, obj: Any, protocol: int | None = None) -> bytes:
        with io.BytesIO() as f:
            self.pickler(f, protocol=protocol).dump(obj)
            return f.getvalue()

    def loads(self, data: bytes) -> Any:
        return self.module.loads(data)


def elaborate_config(kernel: Callable[..., Any], config: dict[str, Any]) -> Any:
    """The PrimFunc ``kernel`` elaborates to for ``config`` (its own ``pass_configs`` left out). A factory
    that returns something else (``None``: a missing ``return``) is named, as this config's error."""
    func = kernel(**split_config(config)[0])
    if not hasattr(func, "script"):  # TVM's PrimFunc (and IRModule) print themselves; nothing else here does
        name = getattr(kernel, "__qualname__", None) or repr(kernel)
        raise TypeError(f"the kernel factory {name} returned {type(func).__name__} ({func!r:.80}) for this config, "
                        f"not a T.prim_func; it must end with `return main` (the @T.prim_func it defines)")
    return func


def build(kernel: Callable[..., Any], config: dict[str, Any], target_spec: Any,
          pass_configs: dict[str, Any] | None = None, prim: Any = None) -> tuple[Any, str]:
    """Elaborate ``kernel`` for ``config`` and compile it with :func:`tl_compile` (a disk-cache hit
    after the first time); returns the kernel and the hash (:func:`.cache.prim_hash`) of the PrimFunc
    it was compiled from, taken before the compile (not of the kernel's ``prim_func``: TileLang's lowered
    copy). A config's own ``pass_configs`` go to the compiler, not to the kernel. ``prim``: the PrimFunc
    ``config`` elaborated to where that was done already (a compile worker's, :func:`load_prim`); the
    same call then, without the 15-25 ms a GEMM's elaboration takes."""
    func = elaborate_config(kernel, config) if prim is None else prim
    digest = prim_hash(func)
    return tl_compile(func, target_spec, merge_pass_configs(pass_configs, split_config(config)[1])), digest


def dump_prim(func: Any) -> bytes | None:
    """``func`` (a PrimFunc) pickled, as TVM pickles its objects (its JSON form); ``None`` if it does not
    pickle. Loaded, it prints the same script, so TileLang's cache key, and its disk-cache hit, are the same."""
    import pickle

    try:
        return pickle.dumps(func)
    except Exception:  # noqa: BLE001 - the measuring side then elaborates the config itself, as before
        return None


def load_prim(blob: bytes | None) -> Any:
    """The PrimFunc :func:`dump_prim` pickled, or ``None`` (no blob, or one that does not load)."""
    import pickle

    if blob is None:
        return None
    try:
        return pickle.loads(blob)
    except Exception:  # noqa: BLE001 - as above: elaborate instead
        return None


def _code_filenames(code: types.CodeType, out: set[str]) -> None:
    out.add(code.co_filename)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_filenames(const, out)


def kernel_sources(kernel: Callable[..., Any]) -> dict[str, list[str]]:
    """Source lines a worker cannot read from disk: notebook cells, REPL input, exec'd strings.

    Only files that do not exist but that ``linecache`` knows in this process are shipped.
    """
    fn = getattr(kernel, "func", kernel)  # functools.partial
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    names: set[str] = set()
    _code_filenames(code, names)
    out: dict[str, list[str]] = {}
    for name in names:
        if os.path.exists(name):
            continue
        lines = linecache.getlines(name)
        if lines:
            out[name] = lines
    return out


def kernel_globals(kernel: Callable[..., Any]) -> bytes | None:
    """The module globals of a kernel that cloudpickle ships by value (``__main__``, notebooks).

    cloudpickle gives such a function only the globals its bytecode names; TileLang evaluates
    annotations (strings under ``from __future__ import annotations``) and the kernel body in
    ``__globals__``, so names used only there (``M``, ``T``...) would be missing in the worker.
    Ship every global that pickles, small ones only; ``None`` for kernels in importable modules.
    """
    import sys

    fn = getattr(kernel, "func", kernel)
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is not None and module.__name__ != "__main__" and getattr(module, "__file__", None):
        return None  # pickled by reference: the worker imports the real module
    pickler = cloudpickle_module()
    out: dict[str, bytes] = {}
    for name, value in list(getattr(fn, "__globals__", {}).items()):
        if name.startswith("__") or value is fn:
            continue
        try:
            blob = pickler.dumps(value)
        except Exception:  # noqa: BLE001 - whatever does not pickle stays behind
            continue
        if len(blob) <= 1 << 20:
            out[name] = blob
    return pickler.dumps(out)


def restore_globals(kernel: Any, blob: bytes | None) -> None:
    if blob is None:
        return
    fn = getattr(kernel, "func", kernel)
    glb = getattr(fn, "__globals__", None)
    if glb is None:
        return
    for name, value in cloudpickle_module().loads(blob).items():
        if name not in glb:
            try:
                glb[name] = cloudpickle_module().loads(value)
            except Exception:  # noqa: BLE001 - a global that fails to load is one the kernel may not need
                continue
    if getattr(fn, "__module__", None) == "__main__":
        # TileLang evaluates string annotations as ForwardRef(module=func.__module__), which reads
        # sys.modules["__main__"], here the worker's own. This runs in a throwaway child only.
        import sys

        main_dict = sys.modules["__main__"].__dict__
        for name, value in glb.items():
            main_dict.setdefault(name, value)


def seed_linecache(sources: dict[str, list[str]]) -> None:
    for name, lines in sources.items():
        # mtime None: linecache.checkcache() leaves entries without a file alone
        linecache.cache[name] = (sum(map(len, lines)), None, list(lines), name)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _child_compile(payload: bytes, glb: bytes | None, config: dict[str, Any], target_spec: Any,
                   pass_configs: dict[str, Any] | None, wfd: int, workdir: str, worker: int) -> None:
    """Runs in the forked compile child: lead a new session, compile in a grandchild, never return.

    The child leads its own process group, so that a timeout (or the worker's death) kills the
    compiler and its nvcc/gcc in one ``killpg``. It does not compile itself: it forks the compiler
    and waits, so that it can always act on its group. When its worker dies, even of SIGKILL, it
    gets SIGTERM (``PR_SET_PDEATHSIG``) and kills the group; when the compiler ends, it reports a
    crash (a result is written by the compiler itself) and kills whatever the compiler left behind.
    """
    import pickle

    leader = False
    try:
        os.setsid()  # own session and process group, so a timeout kills nvcc too
        leader = True
        _lower_priority()
        procs.use_tempdir(workdir)  # TileLang's .cpp/.so pair, gcc's and nvcc's scratch: all in workdir
        signal.signal(signal.SIGTERM, _kill_own_group)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        procs.die_with_parent(worker, signal.SIGTERM)
        me = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            _write_all(wfd, pickle.dumps((Status.COMPILE_ERROR, f"could not start the compiler process: {e}")))
            raise
        fault = os.path.join(workdir, "fault.txt")
        if pid == 0:
            _compiler(payload, glb, config, target_spec, pass_configs, wfd, me, fault)
        _, wstatus = os.waitpid(pid, 0)
        if wstatus != 0:  # the compiler died before it could write a result
            if os.WIFSIGNALED(wstatus):
                why = f"compiler process died with signal {signal.Signals(os.WTERMSIG(wstatus)).name}" + \
                    _where(fault)
            else:
                why = f"compiler process exited with status {os.waitstatus_to_exitcode(wstatus)} without a result"
            _write_all(wfd, pickle.dumps((Status.COMPILE_ERROR, why)))
    finally:
        if leader:
            os.killpg(0, signal.SIGKILL)  # whatever the compiler left running, and this process
        os._exit(1)


#: How much lower than its worker's a compile runs (``nice``), nvcc and gcc included.
COMPILE_NICE = 10


def _lower_priority() -> None:
    """In the compile child: give way to every process of normal priority. Where cores are short, the
    measuring processes (and the tuning process that feeds them) then run first: on a warm grid a
    pool's worth of cache-hit compiles otherwise took the cores while two GPUs measured, and each
    candidate's measuring cost 10% more than on one GPU (an H200 x2 host, 2026-11-28). With cores to
    spare, as a cold tune's compiles mostly have, it changes nothing."""
    try:
        os.nice(COMPILE_NICE)
    except OSError:  # not allowed here: compile at the worker's priority
        pass
    try:  # the new session is a new autogroup where the kernel groups sessions (sched_autogroup_enabled):
        with open("/proc/self/autogroup", "w") as f:  # there nice ranks only inside one, so the group's too
            f.write(str(COMPILE_NICE))
    except OSError:  # no autogroups here, or the write refused: the nice value above is what counts
        pass


def _where(fault: str, frames: int = 8) -> str:
    """Where the compiler was when it crashed, from :mod:`faulthandler`'s report (innermost Python frames
    first), or nothing."""
    try:
        with open(fault) as f:
            lines = [line.strip() for line in f if line.strip().startswith("File ")]
    except OSError:
        return ""
    return "; in " + " < ".join(lines[:frames]) if lines else ""


def _kill_own_group(signum: int, frame: Any) -> None:
    os.killpg(0, signal.SIGKILL)


def _compiler(payload: bytes, glb: bytes | None, config: dict[str, Any], target_spec: Any,
              pass_configs: dict[str, Any] | None, wfd: int, leader: int, fault: str) -> None:
    """Runs in the compiler process (the compile child's child): build, report through ``wfd``. A crash
    (SIGSEGV in the compiler) leaves its Python stack in ``fault``, for the trial's error."""
    import pickle

    status, err, prim = Status.OK, None, None
    try:
        procs.report_crashes(open(fault, "w"))  # noqa: SIM115 - open until this process ends
        procs.die_with_parent(leader, signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # This throwaway process leaves through os._exit, which skips the finalizers that tell an
        # inherited multiprocessing resource tracker to forget objects made here; stop it from
        # registering them at all, or the parent warns of "leaked semaphores" at exit.
        import multiprocessing
        from multiprocessing import resource_tracker

        resource_tracker.register = lambda *args, **kwargs: None
        # In a loky worker the default context is loky's, whose locks are named semaphores in
        # /dev/shm unlinked only by finalizers; TileLang's log handler makes one (tqdm's write
        # lock) on every compile, and os._exit would leave it behind. Fork-context locks are
        # unlinked as soon as they are made.
        multiprocessing.set_start_method("fork", force=True)
        kernel = cloudpickle_module().loads(payload)
        restore_globals(kernel, glb)
        func = elaborate_config(kernel, config)
        build(kernel, config, target_spec, pass_configs, prim=func)
        prim = dump_prim(func)
    except BaseException as e:  # noqa: BLE001 - any failure of the user's kernel or the compiler is a result
        status = Status.COMPILE_ERROR
        err = format_error(e)  # the message whole, the traceback cut: the message names the fault
    try:
        _write_all(wfd, pickle.dumps((status, err, prim)))
    finally:
        os._exit(0)


def compile_task(payload: bytes, glb: bytes | None, sources: dict[str, list[str]], index: int,
                  config: dict[str, Any], target_spec: Any, pass_configs: dict[str, Any] | None,
                  timeout: float, parent_pid: int, scratch: str | None = None) -> CompileOutcome:
    """One task on a worker (or, with one job, in the parent; or on a Ray compile host): compile ``config`` in a
    killable child."""
    return _compile_one(payload, glb, sources, index, config, target_spec, pass_configs, timeout, parent_pid,
                        scratch)


#: In a forked pool worker: the queue on which each task announces ``(pid, index, start)`` as it
#: starts, so that the parent can tell which config a worker was compiling if the worker dies.
_STARTED: Any = None


def _pool_init(parent_pid: int, started: Any) -> None:
    global _STARTED
    _STARTED = started
    procs.worker_init(parent_pid)


def _pool_task(args: tuple) -> CompileOutcome:
    if _STARTED is not None:
        _STARTED.put((os.getpid(), args[3], time.monotonic()))
    return compile_task(*args)


def _worker_prologue(sources: dict[str, list[str]], parent_pid: int) -> None:
    """What a worker does before its compiles: hide the GPU (a worker process never touches it), seed
    the notebook sources, import TileLang once so that each forked compile child starts warm."""
    if os.getpid() != parent_pid:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    seed_linecache(sources)
    import tilelang  # noqa: F401


def _compile_one(payload: bytes, glb: bytes | None, sources: dict[str, list[str]], index: int,
                 config: dict[str, Any], target_spec: Any, pass_configs: dict[str, Any] | None,
                 timeout: float, parent_pid: int, scratch: str | None = None) -> CompileOutcome:
    """Fork a child that compiles ``config``; wait at most ``timeout`` seconds.

    However this returns or raises (Ctrl-C in the parent, SIGTERM in a worker), the child's whole
    process group is dead and reaped, and the compile's temporary directory removed, by then.
    """
    import pickle
    import selectors

    _worker_prologue(sources, parent_pid)
    workdir = procs.make_compile_dir(scratch)
    me = os.getpid()
    t0 = time.perf_counter()
    rfd, wfd = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(rfd)
        os.close(wfd)
        procs.remove_tree(workdir)
        raise
    if pid == 0:  # child
        os.close(rfd)
        _child_compile(payload, glb, config, target_spec, pass_configs, wfd, workdir, me)
    procs.track(pid, workdir)  # a worker's SIGTERM handler kills it and removes workdir
    chunks: list[bytes] = []
    timed_out = False
    wstatus = 0
    try:
        os.close(wfd)
        deadline = t0 + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(rfd, selectors.EVENT_READ)
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    timed_out = True
                    break
                if not sel.select(timeout=left):
                    continue
                data = os.read(rfd, 1 << 16)
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(rfd)
        # The child has written its result (or timed out, or we are being interrupted): kill the
        # group before reaping its leader, whose pid keeps the group id from being reused.
        procs.kill_group(pid)
        _, wstatus = os.waitpid(pid, 0)
        procs.untrack(pid)
        procs.remove_tree(workdir)
    seconds = time.perf_counter() - t0
    if timed_out:
        return CompileOutcome(index, Status.TIMEOUT, f"compile exceeded compile_timeout={timeout:g} s; killed", seconds)
    if chunks:
        try:
            status, err, *prim = pickle.loads(b"".join(chunks))  # (status, err) from the compile child itself
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
            why = "compiler process died while writing its result"
            return CompileOutcome(index, Status.COMPILE_ERROR, why, seconds)
        return CompileOutcome(index, status, err, seconds, prim=prim[0] if prim and status == Status.OK else None)
    if os.WIFSIGNALED(wstatus):
        why = f"compiler process died with signal {signal.Signals(os.WTERMSIG(wstatus)).name}"
    else:
        why = f"compiler process exited with status {os.waitstatus_to_exitcode(wstatus)} without a result"
    return CompileOutcome(index, Status.COMPILE_ERROR, why, seconds)


def default_backend() -> str:
    """``"multiprocessing"`` (forked workers) where this process may fork (:func:`.forking.fork_safe`: Linux,
    and never in a process that has used Ray), else joblib's ``"loky"`` (fresh interpreters).

    Forked workers start with TileLang already imported by the parent; loky's spawned workers each
    import it again (measured on a 16-core H200 machine: 16 GEMM configs compiled in 8.2 s wall with
    loky against 4.4 s for TileLang's threads, the difference being worker start-up). The forked
    workers never touch the GPU, so a CUDA context in the parent is safe, as with PyTorch's
    DataLoader workers.
    """
    return "multiprocessing" if forking.fork_safe() else "loky"


@dataclass(frozen=True)
class CompileBatch:
    """One kernel's candidates for :func:`compile_many`: compile ``configs[i]`` for each ``i`` in ``indices``."""

    kernel: Callable[..., Any]
    configs: Sequence[dict[str, Any]]
    indices: Sequence[int]
    target_spec: Any
    timeout: float
    pass_configs: dict[str, Any] | None = None


def compile_all(kernel: Callable[..., Any], configs: list[dict[str, Any]], indices: list[int], target_spec: Any,
                *, timeout: float, n_jobs: int | None, pass_configs: dict[str, Any] | None = None,
                backend: str | None = None) -> Iterator[CompileOutcome]:
    """Compile ``configs[i]`` for each ``i`` in ``indices``; yield outcomes as they finish (any order).

    The one-kernel case of :func:`compile_many`, which says how the pool works and ends.
    """
    return compile_many([CompileBatch(kernel, configs, indices, target_spec, timeout, pass_configs)], n_jobs=n_jobs,
                        backend=backend)


def compile_many(batches: Sequence[CompileBatch], *, n_jobs: int | None, backend: str | None = None,
                 on_ready: Callable[[], None] | None = None) -> Iterator[CompileOutcome]:
    """Compile every batch's candidates in ONE pool, handed out in the order given (batch after batch);
    yield outcomes as they finish (any order), each naming its ``batch`` and its ``index`` in that batch.

    One pool for a whole job, so that it never drains and refills between kernels. ``backend`` is
    ``"multiprocessing"`` (a pool forked from this process), ``"ray"`` (the compile hosts of the cluster
    :func:`.ray_cluster.connect` finds, :func:`.ray_cluster.compile_on_ray`), or a joblib backend name
    (``"loky"``, ``"dask"``...); ``None`` means :func:`default_backend`. Closing the iterator early (or an
    exception or Ctrl-C while it waits) stops every compile and worker; use ``contextlib.closing`` to make
    that immediate rather than left to garbage collection. Temporary files go to per-compile directories
    inside the active :func:`.procs.run_scratch`. ``on_ready()`` is called once the workers exist (a forked pool: made;
    other backends: when their first task is handed out), for a job's timeline.
    """
    n_jobs = check_setting("n_jobs", n_jobs)  # 0 or -2 would be taken as "none" or "all" by one backend or another
    me = os.getpid()
    scratch = procs.current_scratch()
    tasks, where = [], []  # a task's index is its position in the job; ``where`` maps it back
    for b, batch in enumerate(batches):
        if not batch.indices:
            continue
        payload = cloudpickle_module().dumps(batch.kernel)
        glb = kernel_globals(batch.kernel)
        sources = kernel_sources(batch.kernel)
        for i in batch.indices:
            tasks.append((payload, glb, sources, len(tasks), batch.configs[i], batch.target_spec, batch.pass_configs,
                          batch.timeout, me, scratch))
            where.append((b, i))
    if not tasks:
        return (o for o in ())  # a generator like the other paths: callers may close() it
    n = n_jobs if n_jobs is not None else -1
    if n == -1 or n > len(tasks):
        n = min(len(tasks), os.cpu_count() or 1)
    backend = _fork_free(backend, n) if backend else default_backend()
    ready = on_ready if on_ready is not None else (lambda: None)
    if backend == "ray":  # as many at once as n_jobs, or as the cluster has CPUs
        from .ray_cluster import compile_on_ray

        outcomes = compile_on_ray(tasks, n_jobs, [b.kernel for b in batches if b.indices])
    elif backend == "multiprocessing":
        # one worker: compile from this process (each compile still in a killable child)
        outcomes = _forked_pool(n, tasks, ready) if n > 1 else (compile_task(*t) for t in tasks)
    elif backend == "loky" and n == 1 and not forking.fork_safe():
        outcomes = _one_loky_worker(tasks)  # joblib would run the one job in this process, which may not fork
    else:
        from joblib import Parallel, delayed

        jobs = [delayed(compile_task)(*t) for t in tasks]
        if backend == "loky" and n > 1:
            from joblib.parallel import LokyBackend

            parallel = Parallel(n_jobs=n, backend=LokyBackend(initializer=procs.worker_init, initargs=(me,)),
                                return_as="generator_unordered")
            outcomes = _loky_pool(parallel, jobs, tasks)
        else:
            parallel = Parallel(n_jobs=n, backend=backend, return_as="generator_unordered" if n > 1 else "generator")
            outcomes = parallel(jobs)
    forked = backend == "multiprocessing" and n > 1  # the forked pool says itself when its workers exist
    return _placed(outcomes, where, None if forked else ready)


def _fork_free(backend: str, n: int) -> str:
    """``backend``, or ``"loky"`` where it would fork from this process and this process may not fork
    (:func:`.forking.fork_safe`): the forked pool, joblib's threads, or any joblib backend with one worker
    (joblib then runs the job here, and its compile child is forked from here)."""
    if backend == "ray" or forking.fork_safe() or (backend in ("loky", "dask") and n > 1):
        return backend
    if backend != "loky":
        logger.warning("compile backend %r would fork from this process, which has been a Ray driver or worker "
                       "(autotuner/forking.py); compiling in joblib's loky workers instead", backend)
    return "loky"


def _one_loky_worker(tasks: list[tuple]) -> Iterator[CompileOutcome]:
    """``tasks`` compiled one after another in this process's loky worker (:func:`compile_in_loky`): joblib
    runs ``n_jobs=1`` in this process, whose compile child would be forked from it."""
    for t in tasks:
        yield compile_in_loky(*t)


def compile_in_loky(*task: Any) -> CompileOutcome:
    """:func:`compile_task` in this process's loky worker (:func:`in_loky_worker`). A worker killed from
    outside (the OOM killer, ``kill -9``) costs this config only: a ``compile_error`` saying so, and the
    next call starts a new worker."""
    from concurrent.futures import BrokenExecutor

    t0 = time.perf_counter()
    try:
        return in_loky_worker(compile_task, *task)
    except BrokenExecutor as e:
        return CompileOutcome(task[3], Status.COMPILE_ERROR, "the compile worker died while compiling this config: "
                              f"killed from outside, e.g. by the OOM killer ({error_headline(format_error(e), 300)})",
                              time.perf_counter() - t0)


def _loky_pool(parallel: Any, jobs: list, tasks: list[tuple]) -> Iterator[CompileOutcome]:
    """The outcomes of joblib's loky pool, and where one of its workers is killed from outside (joblib then
    ends the whole pool, and which config that worker held is not known), the configs left compiled one at
    a time (:func:`compile_in_loky`), so that only the config whose worker dies again fails."""
    from concurrent.futures import BrokenExecutor

    done: set[int] = set()
    pool = parallel(jobs)
    try:
        for out in pool:
            done.add(out.index)
            yield out
        return
    except BrokenExecutor as e:
        left = [t for t in tasks if t[3] not in done]
        logger.warning("a compile worker died, killed from outside (%s); compiling the %d configs left one at a "
                       "time", error_headline(format_error(e), 200), len(left))
    finally:
        pool.close()  # closed early (an exception, Ctrl-C): joblib stops its workers
    yield from _one_loky_worker(left)


def in_loky_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in this process's one loky worker (joblib's reusable executor: a fresh interpreter,
    started on the first call and kept for the next ones), for a process that may not fork
    (:func:`.forking.fork_safe`) and would have the compile child forked from it. Interrupted while it
    runs (Ctrl-C, an exception, ``close()`` of a caller's generator), the worker is killed, and its compile
    child's group with it (:func:`.procs.worker_init`, which also ends the worker when this process dies),
    as joblib does with its own loky pools."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from joblib.executor import get_memmapping_executor  # joblib's reusable loky executor, one worker

    executor = get_memmapping_executor(1, initializer=procs.worker_init, initargs=(os.getpid(),))
    future = executor.submit(fn, *args)
    try:
        while True:  # a bounded wait, so that a Ctrl-C delivered to another thread of this process is seen
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                continue
    finally:
        if not future.done():
            executor.terminate(kill_workers=True)


def _placed(outcomes: Iterator[CompileOutcome], where: list[tuple[int, int]],
            ready: Callable[[], None] | None = None) -> Iterator[CompileOutcome]:
    """Each outcome with its batch and its index in that batch; closing this closes the pool's iterator.
    ``ready()``, when given, is called when the first outcome is asked for."""
    if ready is not None:
        ready()
    try:
        for out in outcomes:
            b, i = where[out.index]
            yield replace(out, batch=b, index=i)
    finally:
        close = getattr(outcomes, "close", None)
        if close is not None:
            close()


def _forked_pool(n: int, tasks: list[tuple], ready: Callable[[], None]) -> Iterator[CompileOutcome]:
    """Run ``tasks`` on ``n`` workers forked from this process; yield outcomes as they finish.

    Forked workers start with TileLang imported. The pool is made on the first ``next()``; if the
    consumer stops early (an exception, Ctrl-C, SIGTERM turned into ``SystemExit``, ``close()``),
    it is terminated: each worker gets SIGTERM and kills its compile child's group on the way out.
    A worker killed from outside (the OOM killer, ``kill -9``) takes its task with it, and the pool
    would wait for that task forever: its config is reported as a ``compile_error`` instead.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    started = ctx.SimpleQueue()
    others = {p.pid for p in multiprocessing.active_children()}
    pool = ctx.Pool(n, initializer=_pool_init, initargs=(os.getpid(), started))
    ready()
    pending = {t[3] for t in tasks}
    running: dict[int, tuple[int, float]] = {}  # worker pid -> (index, start) of its latest task
    clean = False
    try:
        results = pool.imap_unordered(_pool_task, tasks, chunksize=1)
        lost = False
        while pending:
            try:
                out = results.next(timeout=1.0)
            except multiprocessing.TimeoutError:
                for out in _lost_tasks(started, running, pending):
                    lost = True
                    yield out
                continue
            if out.index in pending:
                pending.discard(out.index)
                yield out
        clean = not lost
    finally:
        if clean:
            pool.close()
        else:
            terminate_pool(pool, lambda: {p.pid for p in multiprocessing.active_children()} - others)
        pool.join()


def terminate_pool(pool: Any, workers: Callable[[], set[int]], grace: float = 10.0) -> None:
    """``pool.terminate()``, made sure to end: while it waits for the workers, the ones still alive
    (``workers()``, their pids) get SIGTERM again every half second, and SIGKILL after ``grace``.

    Pool.terminate sends each worker one SIGTERM and waits for it to exit. A worker whose signal
    arrives just before it blocks on the pool's task-queue lock never runs its handler (the signal
    was taken before the wait began, so nothing interrupts the wait), and the wait never ends: seen
    about once in a hundred runs whose reference failed. A second SIGTERM interrupts the wait.
    """
    import threading

    stopper = threading.Thread(target=pool.terminate, name="tilecarve-pool-terminate", daemon=True)
    stopper.start()
    deadline = time.monotonic() + grace
    stopper.join(0.5)
    while stopper.is_alive():
        sig = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
        for pid in workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        stopper.join(0.5)


def _lost_tasks(started: Any, running: dict[int, tuple[int, float]], pending: set[int]) -> Iterator[CompileOutcome]:
    """Outcomes for the pending tasks whose worker is dead (it is no longer among our children)."""
    import multiprocessing

    while not started.empty():
        pid, index, start = started.get()
        running[pid] = (index, start)
    alive = {p.pid for p in multiprocessing.active_children()}
    for pid, (index, start) in list(running.items()):
        if pid in alive:
            continue
        del running[pid]
        if index in pending:
            pending.discard(index)
            yield CompileOutcome(index, Status.COMPILE_ERROR, f"the compile worker (pid {pid}) died while compiling "
                                 "this config: killed from outside, e.g. by the OOM killer",
                                 time.monotonic() - start)
