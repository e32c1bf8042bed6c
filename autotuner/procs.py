"""Processes and temporary files that live exactly as long as a tuning run.

A run starts compile workers (a forked pool or loky), one compile child per candidate (its own
session, so that a timeout can kill its ``nvcc``/``gcc`` too), and a measuring process. None of
them may outlive the run: not on Ctrl-C, not on SIGTERM, not when the parent is killed outright.
And TileLang's compilers write a ``/tmp/tmp*.cpp`` + ``.so`` pair (``tempfile.NamedTemporaryFile``
in ``tilelang/jit/adapter/libgen.py``; gcc and nvcc add their own scratch under ``$TMPDIR``) that
nothing removes. The pieces here:

* :func:`run_scratch`: a per-run temporary directory that ``tempfile`` and ``$TMPDIR`` point to
  while the run lasts, removed at its end (error, Ctrl-C and SIGTERM included); directories of runs
  that were killed outright are swept by the next run.
* :func:`die_with_parent`: ``prctl(PR_SET_PDEATHSIG)`` (Linux), the backstop for a parent killed
  with SIGKILL, for children whose forking thread outlives them (compile children, the measuring
  process via :func:`python_child_argv`); :func:`worker_init` for pool workers, which watch their
  parent process instead (:func:`watch_parent`).
* :func:`track` / :func:`kill_tracked`: the process groups of compile children a worker must kill
  before it dies.

Kernels returned by a run stay usable after its directory is removed: TileLang loads a compiled
library eagerly (``ctypes.CDLL`` / ``runtime.load_module``), and a run's winner is loaded from
TileLang's kernel cache (``TILELANG_CACHE_DIR``), not from the scratch directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "current_scratch",
    "die_with_parent",
    "forget_tracked",
    "kill_tracked",
    "make_compile_dir",
    "name_process",
    "python_child_argv",
    "remove_tree",
    "report_crashes",
    "run_scratch",
    "track",
    "untrack",
    "use_tempdir",
    "watch_parent",
    "worker_init",
]

#: Prefix of every per-run directory; :func:`run_scratch` sweeps dead runs' directories by it.
PREFIX = "tilecarve-"
_LOCK_NAME = ".owner.lock"
#: A directory younger than this is never swept (its run may not have locked it yet).
_SWEEP_MIN_AGE_S = 120.0
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _load_prctl() -> Any:
    """``prctl`` from the C library, resolved once in the parent: a forked child then only calls it
    (no ``dlopen`` after fork, which can deadlock in a child of a multi-threaded process)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


_PRCTL = _load_prctl()


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Call it first thing in a child. If ``parent_pid`` is given and the parent already died (the
    child was re-parented before it got here), the child dies now. Returns whether the kernel
    will deliver the signal (``False`` where ``prctl`` is unavailable). Beware that "parent" is
    the *thread* that forked this process: fork from a thread that outlives the child.
    """
    armed = _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
        os._exit(128 + int(sig))  # only if ``sig`` was handled and the handler returned
    return armed


def name_process(name: str) -> bool:
    """Set this process's name as ``ps -o comm``, ``top`` and ``/proc/<pid>/comm`` show it (Linux, 15
    characters; a forked child otherwise shows its parent's). Returns whether it was set."""
    if _PRCTL is None:
        return False
    buf = ctypes.create_string_buffer(name.encode()[:15])
    return _PRCTL(_PR_SET_NAME, ctypes.addressof(buf), 0, 0, 0) == 0


# ---------------------------------------------------------------------------------------------
# compile children a worker owns


#: Compile children (each the leader of its own process group) -> their scratch directory.
_TRACKED: dict[int, str | None] = {}


def track(pgid: int, path: str | None = None) -> None:
    """Remember a child process group (and its scratch directory) to kill if this process dies."""
    _TRACKED[pgid] = path


def untrack(pgid: int) -> None:
    _TRACKED.pop(pgid, None)


def forget_tracked() -> None:
    """In a child forked from a worker: the groups it tracks are its parent's, not its own to kill."""
    _TRACKED.clear()


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_tracked() -> None:
    """Kill every tracked group, reap its leader (our child) and remove its scratch directory."""
    for pgid, path in list(_TRACKED.items()):
        kill_group(pgid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, 0)
        if path is not None:
            remove_tree(path)
        _TRACKED.pop(pgid, None)


def _die_on_signal(signum: int, frame: Any) -> None:
    """A worker's SIGTERM (from ``Pool.terminate``, loky, or its parent's death): take the compile
    children down with it, then die of the same signal."""
    kill_tracked()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def watch_parent(parent_pid: int | None, sig: int = signal.SIGTERM, interval: float = 0.25,
                 sentinel: int | None = None) -> threading.Thread:
    """Send ``sig`` to this process once the parent *process* ``parent_pid`` is gone (a daemon thread
    polls ``os.getppid()``, which changes when the process is re-parented), or, given a ``sentinel``
    instead (:attr:`multiprocessing.process.BaseProcess.sentinel` of the parent, as
    ``multiprocessing.parent_process()`` has it), once that becomes ready: a fork server's child has the
    fork server as its OS parent, but the process that asked for it as its multiprocessing parent.

    For pool workers, instead of :func:`die_with_parent`: ``PR_SET_PDEATHSIG`` fires when the
    *thread* that forked the process ends, and a pool re-forks workers from a helper thread that
    ends at shutdown, when such a worker may be holding the pool's task-queue lock; killed there,
    it deadlocks the pool's ``terminate()`` and ``join()``.

    The thread blocks every signal, so that a signal sent to the process (``Pool.terminate``'s
    SIGTERM) reaches the main thread: delivered to this one, it would leave the main thread asleep
    in a blocking call (a worker waiting for the pool's task-queue lock), and ``join()`` would wait
    for a worker that never runs its handler.
    """
    def watch() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        if sentinel is not None:
            from multiprocessing.connection import wait

            wait([sentinel])
        else:
            while os.getppid() == parent_pid:
                time.sleep(interval)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=watch, name="tilecarve-parent-watch", daemon=True)
    thread.start()
    return thread


def report_crashes(file: Any) -> None:
    """Have a crash of this process (SIGSEGV, SIGABRT, ...) write its Python stack to ``file``
    (:mod:`faulthandler`). Disabled first: enabling it again only changes its file, and a handler installed
    after it (TVM's backtrace printer, when pytest enabled it in a parent) would stay the one that runs."""
    import faulthandler

    faulthandler.disable()
    faulthandler.enable(file)


def worker_init(parent_pid: int | None, sentinel: int | None = None) -> None:
    """Initializer of a compile worker process (forked pool or loky).

    * SIGINT is ignored: Ctrl-C reaches the whole foreground process group, and the parent decides
      (it terminates the pool); a worker dying on its own would orphan its compile child.
    * SIGTERM kills the worker's compile children first (:func:`kill_tracked`).
    * The worker gets SIGTERM when the parent process dies, even of SIGKILL (:func:`watch_parent`: the
      process ``parent_pid``, or the one whose ``sentinel`` this is).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _die_on_signal)
    watch_parent(parent_pid, sentinel=sentinel)


def python_child_argv(code: str) -> list[str]:
    """``argv`` for a fresh interpreter that runs ``code`` and dies with this process.

    The child arms :func:`die_with_parent` before running ``code`` (and dies at once if this
    process is already gone), so it never outlives the run even when the parent is SIGKILLed.
    For ``subprocess.Popen``; call it in the thread that starts the process, and keep that
    thread alive while the child runs (the kernel's notion of "parent" is a thread).
    """
    prologue = f"from autotuner.procs import die_with_parent as _dwp; _dwp({os.getpid()}); del _dwp"
    return [sys.executable, "-c", f"{prologue}\n{code}"]


# ---------------------------------------------------------------------------------------------
# temporary directories


def use_tempdir(path: str) -> None:
    """Point ``tempfile`` and ``$TMPDIR`` (read by gcc, nvcc and child interpreters) at ``path``."""
    tempfile.tempdir = path
    os.environ["TMPDIR"] = path


def remove_tree(path: str) -> None:
    """Remove ``path``; retried briefly, since a child killed a moment ago may still add a file."""
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.05)


def _usable_tempdir() -> str:
    """``tempfile.gettempdir()``, recomputed if it names a directory that is gone (a loky worker
    reused after the run that spawned it, and whose ``$TMPDIR`` it inherited, ended)."""
    d = tempfile.gettempdir()
    if os.path.isdir(d):
        return d
    if not os.path.isdir(os.environ.get("TMPDIR", "/")):
        os.environ.pop("TMPDIR", None)
    tempfile.tempdir = None
    return tempfile.gettempdir()


def make_compile_dir(scratch: str | None) -> str:
    """A fresh directory for one compile: inside the run's ``scratch`` where that exists on this
    machine (not on a remote dask/ray worker), else in the usable system temporary directory."""
    base = scratch if scratch is not None and os.path.isdir(scratch) else _usable_tempdir()
    return tempfile.mkdtemp(prefix="compile-", dir=base)


_STATE_LOCK = threading.Lock()
_ACTIVE: list[str] = []  # run directories now in force, innermost last
_SAVED: tuple[str | None, str | None, str] | None = None  # (tempfile.tempdir, $TMPDIR, base) before the first


def current_scratch() -> str | None:
    """The directory of the innermost active :func:`run_scratch`, or ``None``."""
    with _STATE_LOCK:
        return _ACTIVE[-1] if _ACTIVE else None


def _sweep(base: str) -> None:
    """Remove run directories in ``base`` whose owner is gone: no process holds their lock (it is
    held by the run's parent and its forked children) and they are not brand new."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): nothing is swept
        return
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or now - entry.stat().st_mtime < _SWEEP_MIN_AGE_S:
                continue
            fd = os.open(os.path.join(entry.path, _LOCK_NAME), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            remove_tree(entry.path)
        finally:
            os.close(fd)


def _lock_dir(path: str) -> int | None:
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(os.path.join(path, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


class _Terminated(SystemExit):
    """SIGTERM during a run, turned into an exit that unwinds (and so cleans up)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated(128 + signum)


@contextlib.contextmanager
def run_scratch() -> Iterator[str]:
    """A per-run temporary directory, removed when the block ends, however it ends.

    Inside the block ``tempfile.tempdir`` and ``$TMPDIR`` name the directory, so that this process
    and every process it starts (compile workers, compile children and their compilers, the
    measuring process) put their temporary files there; both are restored afterwards. In the
    main thread, SIGTERM (if it has no handler of its own) raises ``SystemExit(143)`` for the
    duration, so the run unwinds and cleans up instead of vanishing. Directories of earlier runs
    killed outright (SIGKILL) are swept on entry. Blocks may nest and overlap across threads: each
    has its own directory, and the last one to leave restores the original settings.
    """
    global _SAVED
    with _STATE_LOCK:
        base = _SAVED[2] if _SAVED is not None else _usable_tempdir()
    _sweep(base)
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base)
    lock_fd = _lock_dir(path)
    with _STATE_LOCK:
        if not _ACTIVE:
            _SAVED = (tempfile.tempdir, os.environ.get("TMPDIR"), base)
        _ACTIVE.append(path)
        use_tempdir(path)
    installed = False
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
        installed = True
    try:
        yield path
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with _STATE_LOCK:
            _ACTIVE.remove(path)
            if _ACTIVE:
                use_tempdir(_ACTIVE[-1])
            elif _SAVED is not None:
                old_tempdir, old_env, _ = _SAVED
                tempfile.tempdir = old_tempdir
                if old_env is None:
                    os.environ.pop("TMPDIR", None)
                else:
                    os.environ["TMPDIR"] = old_env
                _SAVED = None
        if lock_fd is not None:
            os.close(lock_fd)
        remove_tree(path)
