"""Measuring processes forked from this one, and what this process may ask the GPU without starting CUDA.

A measuring process started as a fresh interpreter imports torch (2.5-3.5 s on an H200 host) and TileLang
(1.5-2 s) before it measures anything; on a warm grid that start is most of what a second, third and
fourth GPU cannot shorten. A child forked from this process has every module this one imported, and
starts its GPU in the 0.5 s the driver takes. A forked child has only the thread that forked it, so
nothing in it may count on a thread pool its parent started:

* CUDA: forking is safe only while this process has not started the driver (``cuInit``); a child of a
  process that has can use no GPU. So measuring processes are forked only before then, and spawned after
  (model code and notebooks that have already used the GPU);
* OpenMP (torch's and MKL's CPU ops): a parallel region in a child of a process that ran one hangs or
  crashes (libgomp); the child runs torch on one thread, which begins none;
* Ray's threads: no forking in a process that has been a Ray driver, even after ``ray.shutdown()``, which
  leaves several of its C++ threads running (8-9 seen with Ray 2.60); children forked after it died of
  SIGSEGV in ordinary allocation (CI, 2026-11-23). :func:`fork_safe` is that rule for the tuning
  process's forks that go on running Python: measuring processes, compile workers, the driver query,
  and a Ray node's compiles (children of a fork server: :class:`.ray_cluster.CompileHost`).

Then:

* :func:`cuda_started` says whether it has (torch's state, then the driver's own answer);
* :func:`local_gpus` gives the visible GPUs' names and architectures (what ``target="auto"`` and
  ``devices="all"`` need) without starting CUDA here: a short-lived forked child asks the driver;
* :func:`can_fork` is the rule for a measuring process, and :func:`fork_child` starts one, returning a
  :class:`ForkedProcess` that the caller handles as a ``subprocess.Popen``.

``TILECARVE_MEASURE_START=spawn`` turns forking off (every measuring process a fresh interpreter).
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable
from typing import Any

from . import procs

logger = logging.getLogger(__name__)

__all__ = ["ForkedProcess", "can_fork", "cuda_started", "fork_child", "fork_safe", "local_gpus", "release_driver"]

#: Environment variable: ``spawn`` starts every measuring process as a fresh interpreter.
START_ENV = "TILECARVE_MEASURE_START"
#: torch's switch for ``torch.cuda.is_available()`` and ``device_count()`` to ask NVML rather than the CUDA
#: runtime, which starts the driver (``cuInit``) and so rules out forking a GPU process afterwards. TileLang
#: asks ``is_available()`` when imported (``tilelang.utils.device``, ``tvm_ffi``): without it, importing
#: TileLang starts CUDA (seen on an H200 host, 2026-11-22: every forked child then failed with "CUDA
#: error: initialization error"). Set here unless the environment sets it: importing tilecarve before
#: TileLang keeps its measuring processes forkable; imported after, they are spawned.
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
os.environ.setdefault(NVML_CHECK_ENV, "1")


def nvml_check() -> bool:
    """Whether torch's CUDA availability checks ask NVML (:data:`NVML_CHECK_ENV`), so do not start CUDA."""
    return os.environ.get(NVML_CHECK_ENV) == "1"


_CUDA_ERROR_NOT_INITIALIZED = 3
#: Seconds the forked driver query may take before the answer is asked of torch instead.
QUERY_TIMEOUT_S = 30.0
FORK_LOCK = threading.Lock()  # one fork (and one Popen of bench.py's) at a time: see fork_child


@functools.cache
def _libcuda() -> Any:
    """The CUDA driver library, or ``None`` where there is none (CPU machines). Loaded once, in the parent:
    a forked child then only calls it (no ``dlopen`` after a fork: :func:`.procs._load_prctl`)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def cuda_started() -> bool:
    """Whether this process has started the CUDA driver: torch has initialised CUDA, or any library called
    ``cuInit`` (before it, every driver call but a few answers ``CUDA_ERROR_NOT_INITIALIZED``)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    lib = _libcuda()
    if lib is None:
        return False
    n = ctypes.c_int()
    return lib.cuDeviceGetCount(ctypes.byref(n)) != _CUDA_ERROR_NOT_INITIALIZED


#: Whether this process has been seen to be a Ray driver or worker (by :func:`fork_safe`); never unset.
_RAY_SEEN = False


def _ray_was_connected(ray: Any) -> bool:
    """Whether Ray is connected here, or was: ``ray.shutdown()`` leaves the driver's error subscriber in
    place (Ray 2.x internals, read defensively: a Ray without them answers by ``is_initialized`` alone).
    Only a module's own answers count: a stand-in for Ray (a test's mock) must not turn forking off for
    the rest of the process."""
    if not isinstance(ray, types.ModuleType):
        return False
    try:
        if getattr(ray, "is_initialized", lambda: False)() is True:
            return True
    except Exception:  # noqa: BLE001 - a half-imported or broken Ray: not connected through it
        return False
    worker = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)
    return type(getattr(worker, "gcs_error_subscriber", None)).__name__ == "GcsErrorSubscriber"


def fork_safe() -> bool:
    """Whether this process may fork a child that goes on running Python (a measuring process, a compile
    worker, the driver query): on Linux, and never once this process has been a Ray driver or worker, whose
    threads outlive ``ray.shutdown()`` (see the module's docstring). Where it may not, those are started as
    fresh interpreters (spawned measuring processes, joblib's loky workers)."""
    global _RAY_SEEN
    if not sys.platform.startswith("linux"):
        return False
    ray = sys.modules.get("ray")
    if ray is not None and not _RAY_SEEN:
        _RAY_SEEN = _ray_was_connected(ray)
    return not _RAY_SEEN


def can_fork(device: str) -> bool:
    """Whether a measuring process for ``device`` (``"cuda"``/``"cpu"``) may be forked from this process:
    where :func:`fork_safe`, unless :data:`START_ENV` says ``spawn``; a GPU one only while this process has
    not started CUDA (:func:`cuda_started`)."""
    if not fork_safe() or os.environ.get(START_ENV, "fork") == "spawn":
        return False
    return device != "cuda" or not cuda_started()


def _reset_child(env: dict[str, str]) -> None:
    """In a forked child, first thing: nothing of this process's run belongs to it (the compile children
    it tracks, its signal handlers, asyncio's wakeup fd, a notebook's stdout); ``env`` is added to its
    environment (``CUDA_VISIBLE_DEVICES``: read when the child starts the driver)."""
    procs.forget_tracked()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.environ.update(env)
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP's thread team (libgomp: torch's and MKL's CPU ops) is not fork-safe: a
        torch.set_num_threads(1)  # parallel region begun here would hang or crash; one thread begins none
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = None
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's own, as a spawned one's
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


class ForkedProcess:
    """A forked child, handled as a ``subprocess.Popen`` is (``pid``, ``returncode``, ``poll``, ``wait``,
    ``kill``); its return code is negative for a signal, as Popen's."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.args = f"forked measuring process {pid}"

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): gone, its code unknown
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fork_child(main: Callable[[], None], env: dict[str, str], name: str | None = None) -> ForkedProcess:
    """Fork a child, named ``name`` if given (:func:`.procs.name_process`), that runs ``main()`` and exits
    (``os._exit``: none of this process's ``atexit`` handlers, ``finally`` blocks or buffered output run
    twice), dying with the thread that forked it (:func:`.procs.die_with_parent`, as a spawned measuring
    process does). One fork at a time, never during one of :mod:`.bench`'s ``Popen`` calls
    (:data:`FORK_LOCK`): a child forked meanwhile would hold the pipe ``Popen`` waits on."""
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed or odd stream: nothing to flush twice
            pass
    with FORK_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()": see the module doc
        pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = 1
    try:
        if name is not None:
            procs.name_process(name)
        procs.die_with_parent(parent)
        _reset_child(env)
        main()
        code = 0
    except BaseException:  # noqa: BLE001 - the child must never return into its parent's stack
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001, S110
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


#: The driver's device attributes (``CUdevice_attribute``) a fact dict carries, under torch's names for them
#: (``torch.cuda.get_device_properties``): what the carver's ``CUDA("cuda")`` overlays on its table.
_ATTRIBUTES = {"major": 75, "minor": 76, "multi_processor_count": 16, "shared_memory_per_block_optin": 97,
               "shared_memory_per_multiprocessor": 81, "L2_cache_size": 38, "regs_per_multiprocessor": 82,
               "max_threads_per_multi_processor": 39, "clock_rate": 13}


def _driver_facts() -> list[dict[str, Any]]:
    """In a forked child: the visible GPUs as the driver sees them (``CUDA_VISIBLE_DEVICES`` applied)."""
    lib = _libcuda()
    if lib is None or lib.cuInit(0) != 0:
        return []
    n = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return []
    out = []
    for i in range(n.value):
        dev, value, total = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        name = ctypes.create_string_buffer(256)
        if (lib.cuDeviceGet(ctypes.byref(dev), i) != 0 or lib.cuDeviceGetName(name, 256, dev) != 0
                or lib.cuDeviceTotalMem_v2(ctypes.byref(total), dev) != 0):
            raise RuntimeError(f"the CUDA driver could not describe device {i}")
        facts: dict[str, Any] = {"name": name.value.decode(), "total_memory": total.value}
        for key, attribute in _ATTRIBUTES.items():
            if lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, dev) != 0:
                raise RuntimeError(f"the CUDA driver could not give device {i}'s {key}")
            facts[key] = value.value
        out.append({**facts, "capability": [facts["major"], facts["minor"]]})
    return out


def _import_tilelang_meanwhile() -> None:
    """Import TileLang here while the forked driver query answers (0.26-0.33 s on an H200 host, 2026-11-23),
    for a caller that compiles or tunes next and so imports it anyway (1.3-2.1 s there) before it can fork
    its measuring processes: the two waits overlap. In this thread: importing on another one let a
    concurrent import on the main thread see a half-imported TVM (11642e5, reverted). Only where the import
    does not start CUDA (:func:`nvml_check`), and not in a process that has imported Ray (a tune there
    starts its measuring actors before this process imports TileLang; a plan for Ray, or for spawned
    measuring processes, does not ask for the prefetch at all). A failed import is left to the caller's
    own ``import tilelang`` to raise."""
    if "tilelang" in sys.modules or "ray" in sys.modules or not nvml_check():
        return
    try:
        import tilelang  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - raised again where the caller imports it
        pass


#: Seconds the driver query's child goes on holding the started driver after it has answered
#: (:func:`_query_forked`), unless :func:`release_driver` ends it first.
HOLD_S = 20.0
_HOLDERS: list[ForkedProcess] = []


def release_driver() -> None:
    """End the driver query's child if it still holds the driver (:func:`_query_forked`): called when a
    tuning job ends, whose measuring processes have started their GPUs by then."""
    while True:
        try:
            holder = _HOLDERS.pop()
        except IndexError:  # none left (another thread's job may have ended at the same time)
            return
        holder.kill()  # reaped by the query's reaping thread


def _open_fds() -> set[int]:
    """This process's open file descriptors (Linux), without the one the listing itself used."""
    try:
        listed = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return set()
    out = set()
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:  # the listing's own, closed by now (its number may be the next open's)
            continue
        out.add(fd)
    return out


def _hold(seconds: float, inherited: set[int]) -> None:
    """In the driver query's child, once it has answered: stay, holding the driver it started, until the
    parent is gone (this child dies with it), kills it (:func:`release_driver`), or ``seconds`` pass.
    While one process has the driver started, another's ``cuInit`` takes 0.03-0.04 s rather than
    0.13-0.5 s (an H200 host, 2026-11-28; 1.4-2 s has been seen on another): the measuring processes a tune
    forks next start their GPUs sooner. Holding the driver is no CUDA context: no GPU memory, no process
    in ``nvidia-smi``'s list. First the descriptors it ``inherited`` from the parent are closed (standard
    streams to ``/dev/null``), keeping the driver's own: a pipe the parent closes must reach its reader as
    EOF now, not when this child ends."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in sorted(inherited):
        try:
            if fd <= 2:
                os.dup2(devnull, fd)
            elif fd != devnull:
                os.close(fd)
        except OSError:
            pass
    time.sleep(seconds)


def _query_forked(meanwhile: Callable[[], None] | None = None) -> list[dict[str, Any]] | None:
    """:func:`_driver_facts` asked of a forked child, which starts the driver in its place; ``None`` when
    it did not answer within :data:`QUERY_TIMEOUT_S`. ``meanwhile()``, when given, runs while it answers.
    The child closes its end once the answer is written, so the answer is read without waiting for its
    exit; it then holds the driver for :data:`HOLD_S` at most (:func:`_hold`), and a thread reaps it."""
    r, w = os.pipe()

    def answer() -> None:
        os.close(r)
        inherited = _open_fds() - {w}
        view = memoryview(json.dumps(_driver_facts()).encode())
        while view:
            view = view[os.write(w, view):]
        os.close(w)  # whole: the end of the answer is here, not at the exit
        _hold(HOLD_S, inherited)

    try:
        child = fork_child(answer, {}, "tilecarve-query")
    except BaseException:
        os.close(w)
        os.close(r)
        raise
    os.close(w)
    data, answered = b"", False
    try:
        if meanwhile is not None:
            meanwhile()
        end = time.monotonic() + QUERY_TIMEOUT_S
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break  # no answer in time
            chunk = os.read(r, 65536)
            if not chunk:
                answered = True
                break
            data += chunk
    finally:  # also on an interrupt (Ctrl-C during meanwhile()): no open pipe, no zombie left behind
        os.close(r)
        if not answered:
            child.kill()
        else:
            _HOLDERS.append(child)
        threading.Thread(target=child.wait, name="tilecarve-reap", daemon=True).start()
    try:
        facts = json.loads(data) if answered and data else None
    except ValueError:  # cut short: it died while writing
        facts = None
    return facts if isinstance(facts, list) else None


def _torch_facts() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        facts = {key: getattr(props, key) for key in ("name", "total_memory", *_ATTRIBUTES) if hasattr(props, key)}
        out.append({**facts, "capability": [props.major, props.minor]})
    return out


_FACTS: dict[str | None, list[dict[str, Any]]] = {}


def local_gpus(prefetch_tilelang: bool = False) -> list[dict[str, Any]]:
    """The GPUs this process sees (``CUDA_VISIBLE_DEVICES`` applied), in torch's order: ``name`` (as
    ``torch.cuda.get_device_name``), ``capability`` (``[major, minor]``) and, under the names
    ``torch.cuda.get_device_properties`` gives them, ``total_memory`` and :data:`_ATTRIBUTES` (from torch,
    those its properties have). Asked once per setting of
    ``CUDA_VISIBLE_DEVICES``; without starting CUDA here (a forked child asks the driver) unless it is
    started already or no child can be forked, so that the measuring processes can still be forked.
    ``prefetch_tilelang`` (a caller that compiles or tunes next): TileLang is imported while the driver
    answers (:func:`_import_tilelang_meanwhile`)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible not in _FACTS:
        facts = None
        if fork_safe() and not cuda_started() and _libcuda() is not None:
            facts = _query_forked(_import_tilelang_meanwhile if prefetch_tilelang else None)
            if facts is None:
                logger.warning("the CUDA driver did not describe the GPUs within %g s; asking torch, which starts "
                               "CUDA in this process, so its measuring processes are spawned, not forked",
                               QUERY_TIMEOUT_S)
        _FACTS[visible] = facts if facts is not None else _torch_facts()
    return _FACTS[visible]
