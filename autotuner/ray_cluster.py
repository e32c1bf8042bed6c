"""Tuning on a Ray cluster (``set_tuning(backend="ray")``): a compile host per node, a measuring actor per GPU.

* **Which cluster.** The Ray instance this process is already connected to (the user called
  ``ray.init``), else the cluster ``RAY_ADDRESS`` names, else a local instance started here, without
  the dashboard; it stays up for later runs of this process (``ray.shutdown()`` ends it).
* **Compiling.** One :class:`CompileHost` actor per node, holding that node's share of the compile slots
  (:func:`host_slots`: ``n_jobs``, or every CPU of the cluster), whose compiles are children of a fork
  server that imported TileLang and the kernels' modules once; each runs the very
  :func:`.compile.compile_task` a local worker runs (a killable child per compile, with its timeout). The
  plan starts the hosts (:func:`prestart_compile_hosts`). The kernel travels as it does to joblib workers
  (cloudpickle, with the globals it needs and a notebook kernel's source), once per run through Ray's
  object store. Outcomes come back as they finish. A lost host's running compiles are handed out again and
  the host is started again; a config is a ``compile_error`` for a lost host only when it brought the host
  down compiling alone; with no host left the run stops rather than record what it did not try
  (:func:`compile_on_ray`).
* **Measuring.** One actor per device: ``num_gpus=1`` (Ray pins it to its GPU), no CPU reserved, so
  the compile hosts keep every core; on the C target a fake device that reserves nothing. Each actor
  holds a :class:`.bench.Benches` (every problem of the job) and plays the part of one isolated measuring process behind
  :class:`.devices.DevicePool`'s queue (:class:`RayBench`). A kernel that crashes its actor costs its
  candidate (``runtime_error``) and Ray restarts the actor; one that runs past ``run_timeout`` gets
  the actor killed and restarted (``timeout``). An actor that cannot come back, its node gone and no
  GPU free, is dropped (:class:`.devices.DeviceLost`) and the run finishes on the others.
* **Kept for the next run.** A run that ends keeps its actors and hosts for :data:`KEEP_S` seconds, and
  this process's next run takes them (:func:`prestart_actors`, :func:`prestart_compile_hosts`), its
  measuring starting at once rather than after fresh Ray workers import torch and TileLang (7-8 s). Each
  refuses another run once a module it imported changed on disk (:func:`_stale`); an actor whose torch
  settings a job changed is not kept; :func:`end_kept` ends them at once.
* **The database stays on the driver** (this process): each trial is written as it arrives, so a lost
  node costs its in-flight candidates only, and a re-run resumes from the recorded trials.

Workers import what this process imports: their ``PYTHONPATH`` is this process's ``sys.path``, and
they share its ``TILELANG_CACHE_DIR`` if one is set, so a candidate compiled by a host on the same
machine is a disk-cache hit for the actor that measures it. On other machines the actor compiles the
candidate again unless that directory is on a shared file system.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import procs, spares
from .bench import Benches, BenchSpec, ServedBench, load_specs, serve_one, spec_payload, start_device
from .compile import CompileOutcome, compile_task
from .devices import Device, DeviceLost, device_name
from .trial import Status, format_error

__all__ = ["ANY_MODEL", "CompileHost", "MeasuringActor", "RayBench", "compile_on_ray", "connect", "end_kept",
           "host_slots", "prestart_actors", "prestart_compile_hosts", "resolve_ray_devices", "worker_runtime_env"]

logger = logging.getLogger(__name__)

#: The model a device is expected to be with ``allow_mixed_devices=True``: any (each trial records its device).
ANY_MODEL = "any model"
#: Seconds an actor may take to come up the first time (imports, CUDA context), as the measuring process.
START_TIMEOUT_S = 600.0
#: Seconds a restarted actor may take to come back before its device is dropped (a lost node whose
#: actor finds no free GPU elsewhere never comes back).
RESTART_TIMEOUT_S = 180.0
#: Calls that find the actor dead, a second apart, before it is taken as dead for good.
DEAD_CALLS = 5
#: Host losses a config may be in flight at before it is compiled alone on its host (:func:`compile_on_ray`).
COMPILE_RETRIES = 2
#: Seconds a compile host may take to come up (its fork server importing TileLang and the kernels' modules).
HOST_START_TIMEOUT_S = 600.0
#: Seconds into a run with no compile host up yet after which the run says, once, what it is waiting for.
HOST_PENDING_LOG_S = 30.0
#: How often, per node, a lost compile host is started again there (:func:`compile_on_ray`): enough for a config
#: that brings its host down to be compiled alone and found out.
HOST_RESTARTS = 3
#: Seconds a compile host gets to end its compiles and remove its scratch directory before it is killed.
HOST_SHUTDOWN_S = 5.0
#: Seconds a compile host or measuring actor started ahead of its job (:mod:`.spares`) waits for the job to
#: take it before it ends itself: the plan was never tuned, or its run stopped during the plan. A job takes
#: none older than :data:`.spares.MAX_AGE_S`.
UNCLAIMED_EXIT_S = spares.MAX_AGE_S + 120.0
#: Seconds the measuring actors and compile hosts of a run that ended wait for this process's next run (which
#: takes them, imports done and GPUs started: :func:`prestart_actors`, :func:`prestart_compile_hosts`) before
#: they end themselves and free their GPUs and CPUs; :func:`end_kept` ends them at once.
KEEP_S = 60.0
#: A kept actor or host is taken only if it has this many seconds left before it ends itself.
KEEP_MARGIN_S = 15.0
#: Seconds a plan waits for the measuring actors of a run that is ending (its devices' threads hand them
#: back) before it starts new ones: run after run, the next plan takes them rather than waiting for GPUs.
HANDBACK_S = 5.0


def connect() -> Any:
    """The ``ray`` module, connected: to the instance this process already uses, else to ``RAY_ADDRESS``,
    else to a local instance started now. Call it outside a run's scratch directory (:mod:`.procs`):
    a local instance keeps its files under ``$TMPDIR``."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("set_tuning(backend='ray') needs Ray: pip install 'tilecarve[ray]' "
                          "(or pip install 'ray>=2.31')") from e
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            logger.info("connecting to the Ray cluster at %s (RAY_ADDRESS)", address)
            ray.init(address=address)
        else:
            logger.info("starting a local Ray instance (no dashboard); it stays up for later runs")
            ray.init(include_dashboard=False, log_to_driver=False)
    return ray


def worker_runtime_env() -> dict[str, Any]:
    """What the run's Ray workers take from this process: its import path (the user's kernels, an
    uninstalled checkout) and TileLang's kernel cache directory, when one is set."""
    env = {"PYTHONPATH": os.pathsep.join(_import_path()[0])}
    if os.environ.get("TILELANG_CACHE_DIR"):
        env["TILELANG_CACHE_DIR"] = os.environ["TILELANG_CACHE_DIR"]
    return {"env_vars": env}


@functools.cache
def _tilelang_dir() -> str | None:
    """TileLang's package directory, found without importing it; ``None`` where it is not installed."""
    spec = importlib.util.find_spec("tilelang")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.abspath(locations[0]) if locations else None


def _tilelang_owned() -> list[str]:
    """Where the entries TileLang puts on ``sys.path`` when imported lie: its package directory (an
    installed wheel: ``3rdparty/tvm/python``, ``lib``), and in a source checkout the checkout's ``build``
    and ``3rdparty`` directories, and ``TVM_IMPORT_PYTHON_PATH`` when set (``tilelang/env.py``)."""
    own = _tilelang_dir()
    if own is None:
        return []
    out = [own]
    root = os.path.dirname(own)
    if os.path.isdir(os.path.join(root, "3rdparty")) and os.path.isdir(os.path.join(root, "tilelang")):
        out += [os.path.join(root, "build"), os.path.join(root, "3rdparty")]
    if os.environ.get("TVM_IMPORT_PYTHON_PATH"):
        out.append(os.path.abspath(os.environ["TVM_IMPORT_PYTHON_PATH"]))
    return out


def _import_path() -> tuple[list[str], str | None]:
    """This process's import path, made absolute, and its TileLang cache directory setting. Also what
    :func:`run_options` asks a worker of the cluster for. Without the entries inside TileLang's package
    (its TVM and its libraries): TileLang puts them on ``sys.path`` when it is imported, in this process
    and in every worker, which imports it before it compiles or measures, so a run's path does not change
    when this process imports TileLang halfway through the plan (seen 2026-11-22: the warm-ups went to
    Ray's idle workers, then the compiles, asked about again, to 8 new workers importing for 8-10 s)."""
    owned = _tilelang_owned()
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    paths = [p for p in paths if not any(p == o or p.startswith(o + os.sep) for o in owned)]
    return list(dict.fromkeys(paths)), os.environ.get("TILELANG_CACHE_DIR")


def _session(ray: Any) -> str:
    """This process's current connection to Ray: its job id, which alone does not tell two local instances
    apart (each one's first job is ``01000000``), at the node it connected through (a new id per instance)."""
    context = ray.get_runtime_context()
    return f"{context.get_job_id()}@{context.get_node_id()}"


#: Seconds :func:`run_options` waits for an idle worker's import path before it passes the runtime env anyway.
PROBE_TIMEOUT_S = 1.0
#: Per Ray session (:func:`_session`), import path and cache directory: whether the workers need
#: :func:`worker_runtime_env` (see :func:`run_options`).
_NEEDS_ENV: dict[tuple, bool] = {}


def run_options(ray: Any) -> dict[str, Any]:
    """The ``runtime_env`` option of a run's tasks and actors: :func:`worker_runtime_env`, or nothing when
    the cluster is this one node and a worker started as Ray starts them already imports from every path
    this process does, with the same TileLang cache directory (Ray started from this environment, as a
    local instance is). Then Ray's idle workers, started with the cluster, run the actors and compile hosts
    at once, where a worker made for a runtime env starts in 2 s (and more when many start together).
    Asked once per Ray session and setting of this process's import path and cache directory (one that
    changes between runs is asked about again), of an idle worker, within :data:`PROBE_TIMEOUT_S`."""
    mine, my_cache = _import_path()
    job = (_session(ray), tuple(mine), my_cache)
    if job not in _NEEDS_ENV:
        needs = True
        try:
            if len([n for n in ray.nodes() if n.get("Alive")]) == 1:
                paths, cache_dir = ray.get(ray.remote(_import_path).options(num_cpus=0).remote(),
                                           timeout=PROBE_TIMEOUT_S)
                needs = not (set(mine) <= set(paths) and cache_dir == my_cache)
        except Exception as e:  # noqa: BLE001 - no idle worker in time, or one that cannot import this module
            logger.debug("asking a Ray worker for its import path failed (%s): passing the runtime env", _headline(e))
        _NEEDS_ENV[job] = needs
        logger.debug("Ray workers %s the run's runtime env", "need" if needs else "do not need")
    return {"runtime_env": worker_runtime_env()} if _NEEDS_ENV[job] else {}


def resolve_ray_devices(devices: str | Sequence[int] | None, kind: str, model: str | None,
                        allow_mixed: bool) -> list[Device]:
    """The measuring actors a run asks for, labelled ``ray:<index>``: one per GPU of the cluster for
    ``None`` or ``"all"``, else one per listed index (Ray picks the GPUs; the first listed re-times the
    finalists). On the C target, ``None`` is one fake device and ``"all"`` one per CPU of the cluster.
    Each actor must run on ``model`` (the target's GPU) unless ``allow_mixed``; it checks when it starts."""
    ray = connect()
    have = ray.cluster_resources()
    count = int(have.get("GPU", 0)) if kind == "cuda" else int(have.get("CPU", 1))
    if devices is None or devices == "all":
        indices = list(range(count if kind == "cuda" or devices == "all" else 1))
    else:
        indices = list(devices)
    if kind == "cuda" and count == 0:
        raise ValueError("backend='ray': the Ray cluster has no GPUs (ray.cluster_resources() has no 'GPU'); "
                         "start its nodes with GPUs, or tune without backend='ray'")
    if kind == "cuda" and len(indices) > count:
        raise ValueError(f"backend='ray', devices={devices!r}: the Ray cluster has {count} GPU(s), so "
                         f"{len(indices)} measuring actors cannot each have one; ask for at most {count}, "
                         "or devices=None for one per GPU")
    name = "cpu" if kind != "cuda" else ANY_MODEL if allow_mixed or model is None else model
    return [Device(i, f"ray:{i}", name) for i in indices]


class MeasuringActor:
    """The body of one measuring actor: a :class:`.bench.Benches` on the actor's device, answering the
    requests an isolated measuring process answers (:func:`.bench.serve_one`).

    It is created with its device only, possibly during the plan (:func:`prestart_actors`), and starts
    that device at once (:func:`.bench.start_device`); the job's specs come with each call, as a reference
    to Ray's object store that is read once (and again after Ray restarts the actor)."""

    def __init__(self, device: str, unclaimed_exit_s: float = UNCLAIMED_EXIT_S) -> None:
        # TileLang's .cpp/.so pairs of a candidate compiled here (a node other than its compile host's)
        # go to a scratch directory of this actor's; the next run on this node sweeps it once the actor is gone
        up = time.time()
        self._scratch = contextlib.ExitStack()
        self._scratch.enter_context(procs.run_scratch())
        self.device = device
        import ray

        if ray.get_runtime_context().was_current_actor_reconstructed:  # restarted by Ray during its job's run: its
            self._claimed = _Claim()  # device's next candidate may be minutes away; one restarted while kept is
            self._claimed.set()  # ended by the driver (:func:`_sweep_kept`)
        else:
            self._claimed = _end_unless_claimed(self._scratch.close, "measuring actor", unclaimed_exit_s)
        # what this Ray worker process imported before it became this actor (it may have run other tasks) dates
        # from its start; what the actor imports, from now
        self._up_at, self._before = up, (_process_start(), frozenset(sys.modules))
        self._main_names = set(vars(sys.modules["__main__"])) if "__main__" in sys.modules else set()
        self._runs = 0  # jobs it has served
        self._stamps = [(up, "process up"), *start_device(device)]  # a job's timeline
        self._flags = _torch_flags()
        self.benches: Benches | None = None

    def _benches(self, payload: list) -> Benches:
        """The job's :class:`.bench.Benches`, made from ``payload[0]`` (an object reference) at the first call."""
        self._claimed.set()
        if self.benches is None:
            import ray

            self.benches = Benches(load_specs(*ray.get(payload[0])))
            self.benches.stamps += [*self._stamps, (time.time(), "imports done")]
        return self.benches

    def info(self) -> dict[str, Any]:
        """Where this actor runs: its device's model, its node and Ray's GPU ids for it."""
        import ray

        self._claimed.set()
        return {"name": device_name(self.device, 0), "node": ray.util.get_node_ip_address(),
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def load(self, payload: list) -> None:
        """Unpickle the job's specs now (importing the kernels' modules), not at the first request."""
        self._benches(payload)

    def call(self, msg: tuple, payload: list) -> tuple[str, Any]:
        return serve_one(self._benches(payload), msg)

    def keep(self, after: float) -> str | None:
        """Its job is over: free the job's problems (inputs, references, kernels) and, unless it should not
        serve another job (the reason is returned: the driver then ends it), wait ``after`` seconds for one
        of the driver's, then end (:func:`_end_unless_claimed`). Its imports, its CUDA context and its L2
        flush buffer stay: the next job measures at once. Not kept: one whose GPU has a pending error, one
        whose torch numerics settings a job changed (a reference that set TF32, say: the next job's
        reference would run under them), one that served :data:`KEEP_RUNS` jobs."""
        self._runs += 1
        if self.benches is not None:
            self.benches.close()
        self.benches = None
        gc.collect()
        try:
            if self.device == "cuda":
                import torch

                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - its context is not fit for another job
            return f"its GPU reports an error ({_headline(e)})"
        return _unfit(self._flags, self._main_names, self._runs) or self.rearm(after)

    def rearm(self, after: float) -> str | None:
        """Taken, or kept, for a job that has not called it yet: end unless one does within ``after`` seconds.
        Refused (the reason is returned) when a module it imported may have changed since (:func:`_stale`)."""
        stale = _stale(self._up_at, self._before)
        if stale is not None:
            return stale
        self._claimed = _rearmed(self._claimed, self._scratch.close, "measuring actor", after)
        self._stamps = [(time.time(), "kept from an earlier run")]
        return None


#: Jobs a measuring actor serves before it is no longer kept (each leaves loaded kernels in TileLang's caches).
KEEP_RUNS = 16
#: Seconds before a process's start within which a changed module file counts as changed after it (clock skew
#: between a file system and the host).
STALE_MARGIN_S = 2.0


def _stale(since: float, before: tuple[float, frozenset] | None = None) -> str | None:
    """Whether a module this process has imported may be older than its file: a file whose content or inode
    changed (``ctime``, which copies and ``touch`` cannot set back; or ``mtime``) at or after ``since``, when
    this process started importing, less :data:`STALE_MARGIN_S`; ``before``: ``(start, names)``, the modules
    ``names`` were imported earlier, from ``start`` on. A kept actor or fork server with such a module would run
    a kernel or reference as it was, not as it is. The file, or ``None``."""
    for name, module in list(sys.modules.items()):
        when = before[0] if before is not None and name in before[1] else since
        try:
            f = getattr(module, "__file__", None)
            if not isinstance(f, str) or not os.path.isabs(f):
                continue
            try:
                st = os.stat(f)
            except FileNotFoundError:
                if os.path.isdir(os.path.dirname(f)):  # removed or renamed (not a module from a zip file)
                    return f"{f} is gone since it was imported ({name})"
                continue
            if max(st.st_mtime, st.st_ctime) >= when - STALE_MARGIN_S:
                return f"{f} changed after it was imported ({name})"
        except Exception:  # noqa: BLE001 - an odd entry of sys.modules (a lazy module's __getattr__): skipped
            continue
    return None


def _process_start() -> float:
    """When this process started (a Ray worker may have run other tasks, and imported modules, before this
    actor was made in it): its ``/proc`` entry's time on Linux, else now."""
    try:
        return os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return time.time()


def _unfit(flags: tuple, main_names: set[str], runs: int) -> str | None:
    """Why a measuring process that started with torch settings ``flags`` and ``__main__`` names ``main_names``
    and has served ``runs`` jobs should not serve another, or ``None``: a job changed torch's numerics settings
    (the next job's reference would run under them), or put a kernel's globals into ``__main__`` (a kernel or
    reference defined there: :func:`.compile.restore_globals` adds what is missing, and would leave this job's
    values to the next), or it served :data:`KEEP_RUNS` jobs."""
    if _torch_flags() != flags:
        return "a job changed its torch numerics settings"
    main = sys.modules.get("__main__")
    if main is not None and set(vars(main)) - main_names:
        return "it ran a kernel or reference defined in __main__"
    if runs >= KEEP_RUNS:
        return f"it has served {runs} jobs"
    return None


def _torch_flags() -> tuple:
    """torch's process-wide numerics settings that a reference may change (``None`` without torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    b = torch.backends
    return (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
            b.cuda.matmul.allow_fp16_reduced_precision_reduction, b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype(), b.cudnn.deterministic,
            b.cudnn.benchmark)


@dataclass
class _Spare:
    """An actor created during the plan (:func:`prestart_actors`, :func:`prestart_compile_hosts`), waiting
    for its job (:mod:`.spares`)."""

    actor: Any
    spawned: float  # when it was created, or kept (:func:`_keep`)
    job: str  # the Ray session (:func:`_session`: this process's connection to Ray) it was created in
    kept: bool = field(default=False, kw_only=True)  # it served an earlier run of this process (:func:`_keep`)
    path: tuple = field(default_factory=lambda: _path_key(), kw_only=True)  # the import path it was given
    # the modules of the kernels and references of the jobs it served (a measuring actor)
    modules: frozenset = field(default=frozenset(), kw_only=True)

    def same_path(self) -> bool:
        """Whether this process's import path and TileLang cache directory are still the ones it was given."""
        return self.path == _path_key()

    def mine(self) -> bool:
        """Whether it belongs to this process's current Ray connection (an actor of an earlier ``ray.init``
        went with its ``ray.shutdown``, and must not be named to the new one)."""
        import ray

        return ray.is_initialized() and _session(ray) == self.job

    def alive(self) -> bool:
        """Whether a job may take it (:meth:`mine`). One that died is restarted by Ray (a measuring actor) or
        found out by the job (a compile host)."""
        return self.mine()

    def close(self) -> None:
        import ray

        if self.mine():
            ray.kill(self.actor, no_restart=True)


def _path_key() -> tuple:
    """This process's import path and TileLang cache directory, as a run's workers get them (:func:`_import_path`)."""
    paths, cache_dir = _import_path()
    return tuple(paths), cache_dir


class _Claim:
    """Whether a job has called the actor this runs in (:meth:`set`), else, once its watch has given up on
    one (:func:`_end_unless_claimed`), ``ending``: a claim then raises rather than have a job use an actor
    that is ending itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = threading.Event()
        self.ending = False

    def set(self) -> None:
        with self._lock:
            if self.ending:
                raise RuntimeError("this actor is ending itself: no job called it in time")
            self._set.set()

    def give_up(self, after: float) -> bool:
        """Wait ``after`` seconds for a claim; ``True`` (and ``ending``) if none came."""
        if self._set.wait(after):
            return False
        with self._lock:
            self.ending = not self._set.is_set()
            return self.ending


def _rearmed(claimed: _Claim, cleanup: Any, what: str, after: float) -> _Claim:
    """A new :func:`_end_unless_claimed` claim for an actor kept or taken for another job; the one it had,
    ``claimed``, is set first, so that its watch ends (it raises if that watch has given up: the actor is
    ending)."""
    claimed.set()
    return _end_unless_claimed(cleanup, what, after)


def _end_unless_claimed(cleanup: Any, what: str, after: float, start: threading.Thread | None = None) -> _Claim:
    """A claim that the actor this runs in sets when its job first calls it; unset ``after`` seconds
    (:data:`UNCLAIMED_EXIT_S`) after the actor is up (once the thread ``start``, already started, ended), the
    actor runs ``cleanup`` and ends itself for good (Ray does not restart it), so that one started for a plan
    that never reaches its job frees its CPUs or GPU (the driver, a notebook, may live on for hours)."""
    claimed = _Claim()

    def watch() -> None:
        if start is not None:
            start.join(HOST_START_TIMEOUT_S)  # a start that hangs does not keep it from ending
        if not claimed.give_up(after):
            return
        import ray

        logger.warning("no job took this %s within %g s; it ends", what, after)
        with contextlib.suppress(Exception):
            cleanup()
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    threading.Thread(target=watch, name="tilecarve-unclaimed", daemon=True).start()
    return claimed


_KEPT_LOCK = threading.Condition()
_KEPT: dict[tuple, list[_Spare]] = {}  # kind (as :mod:`.spares`) -> actors and hosts of ended runs
_OPEN_BENCHES = 0  # RayBenches of running jobs, whose actors are handed back when their devices' threads end


def _keep(kind: tuple, spare: _Spare) -> None:
    """Keep ``spare`` (an actor or host whose run ended, told to wait :data:`KEEP_S`) for this process's next run."""
    spare.spawned, spare.kept = time.time(), True
    with _KEPT_LOCK:
        _KEPT.setdefault(kind, []).append(spare)
    sweep = threading.Timer(KEEP_S + KEEP_MARGIN_S, _sweep_kept)
    sweep.daemon = True
    sweep.start()


def _sweep_kept() -> None:
    """End what was kept longer than :data:`KEEP_S`: each ends itself then, but for an actor Ray restarted while
    it was kept (its job is unknown to it, so it has no watch)."""
    with _KEPT_LOCK:
        kinds = list(_KEPT)
    for kind in kinds:
        _take_kept(kind, sweep=True)


def _take_kept(kind: tuple, modules: frozenset | None = None, sweep: bool = False) -> _Spare | None:
    """A kept actor or host of ``kind`` with at least :data:`KEEP_MARGIN_S` left before it ends itself, given
    this process's import path (:meth:`_Spare.same_path`) and, for ``modules`` (a job's kernels' and references'
    modules), one whose jobs imported none but those (what they did on import stays in it), removed from the
    kept ones; the others are ended now (they hold GPUs or CPUs the run needs). Whether what it imported is
    unchanged is its own to say (:func:`_rearm_taken`). ``sweep``: only end the ones too old to be taken."""
    with _KEPT_LOCK:
        kept = _KEPT.pop(kind, [])
        fresh = [s for s in kept if time.time() - s.spawned < KEEP_S - KEEP_MARGIN_S and s.alive() and s.same_path()
                 and (modules is None or s.modules <= modules)]
        _KEPT[kind] = fresh if sweep else fresh[1:]
    for s in kept:
        if not any(s is f for f in fresh):
            with contextlib.suppress(Exception):
                s.close()
    return None if sweep or not fresh else fresh[0]


def _rearm_taken(spares_: Sequence[_Spare]) -> bool:
    """Have kept actors or hosts wait for the job that takes them as ones a plan started would
    (:data:`UNCLAIMED_EXIT_S`); ``False``, and all of them ended, unless every one agrees: one whose modules
    changed since it imported them (:func:`_stale`) refuses, and one that does not answer has ended."""
    import ray

    refused = _refusal(ray, [s.actor.rearm.remote(UNCLAIMED_EXIT_S) for s in spares_])
    if refused is not None:
        logger.info("not using the Ray actors kept from the last run (%s); starting others", refused)
        _end(spares_)
        return False
    return True


def _refusal(ray: Any, calls: list) -> str | None:
    """The first reason kept actors or hosts gave for refusing another run (``calls``: their ``keep`` or
    ``rearm``), or the error of one that did not answer within :data:`HOST_SHUTDOWN_S` (gone, or stuck);
    ``None`` when every one agreed."""
    try:
        return next((r for r in ray.get(calls, timeout=HOST_SHUTDOWN_S) if r is not None), None)
    except Exception as e:  # noqa: BLE001 - gone, or stuck
        return _headline(e)


def end_kept() -> int:
    """End, now, the measuring actors and compile hosts this process's ended runs keep for its next run
    (they would end themselves :data:`KEEP_S` seconds after their run), freeing their GPUs and CPUs; how many."""
    _await_handbacks()
    with _KEPT_LOCK:
        kept = [s for ss in _KEPT.values() for s in ss]
        _KEPT.clear()
    _end(kept)
    return len(kept)


def _end(spares_: Sequence[_Spare]) -> None:
    """End kept or spare actors and hosts now, the hosts waited for (:func:`_end_hosts`)."""
    for s in spares_:
        if not isinstance(s, _Host):
            with contextlib.suppress(Exception):
                s.close()
    with contextlib.suppress(Exception):
        _end_hosts([s for s in spares_ if isinstance(s, _Host)])


def _await_handbacks() -> None:
    """Wait (at most :data:`HANDBACK_S`) for the measuring actors of runs that are ending to be kept: the
    devices' threads of a run hand them back after the run has returned."""
    with _KEPT_LOCK:
        _KEPT_LOCK.wait_for(lambda: _OPEN_BENCHES == 0, timeout=HANDBACK_S)


def _new_actor(ray: Any, device: str) -> Any:
    """A measuring actor for ``device`` (``"cuda"``: one GPU; ``"cpu"``: a fake device reserving nothing)."""
    gpu = {"num_gpus": 1} if device == "cuda" else {}
    return ray.remote(MeasuringActor).options(num_cpus=0, **gpu, max_restarts=-1, max_task_retries=0,
                                              **run_options(ray), name=None).remote(device, UNCLAIMED_EXIT_S)


def prestart_actors(n: int, device: str, callables: Sequence[Any] = ()) -> None:
    """Have the ``n`` measuring actors a job on ``device`` will take waiting (:mod:`.spares`): those an ended
    run of this process kept (:data:`KEEP_S`; imports done, GPU started) for a job of ``callables`` (its
    kernel and reference: :func:`_take_kept`), else ones created now, so that their workers start and import
    while the job is planned."""
    ray = connect()
    job = _session(ray)
    _await_handbacks()
    have = spares.count(("ray", device))
    modules = frozenset(_kernel_modules(callables))
    while have < n and (kept := _take_kept(("ray", device), modules)) is not None:
        if _rearm_taken([kept]):
            spares.keep(("ray", device), _Spare(kept.actor, time.time(), job, kept=True, path=kept.path,
                                                modules=kept.modules))
            have += 1
    while (extra := _take_kept(("ray", device))) is not None:  # a GPU this run does not ask for
        extra.close()
    for _ in range(n - have):
        spares.keep(("ray", device), _Spare(_new_actor(ray, device), time.time(), job))


class CompileHost:
    """The compile side of one node of the cluster: a Ray actor holding the node's compile slots, whose
    compiles are forked from a fork server that imported TileLang and the kernels' modules once.

    A Ray worker may not fork a Python child (:mod:`.forking`), and each fresh interpreter imports TileLang
    (3-13 s, the more at once the slower). So the host starts Python's ``forkserver`` (a fresh interpreter
    with nothing of Ray's, started by ``fork``+``exec``) with TileLang preloaded, and each compile is a child
    forked from it at once, which runs :func:`.compile.compile_task` (a killable compile child with its
    timeout, as on a local worker) and sends back the outcome. One import per node, where one task per
    config on Ray's workers imported TileLang in each worker (seen 2026-11-28: the first compile of a cold
    288-config grid came 5 s later than on the direct path, and every slot 13 s later).

    A compile child that dies (killed from outside) costs its config only; :meth:`shutdown` ends every
    compile running here and removes the host's scratch directory. The host is a threaded actor: one call
    per compile, at most its slots at once, plus room for :meth:`shutdown`. Killed (its node lost, or the
    run over), the compile children it asked for stop theirs and end (:func:`_hosted_compile`). Started
    for a job that does not take it (:meth:`claim`), it ends itself (:func:`_end_unless_claimed`)."""

    def __init__(self, preload: list[str], unclaimed_exit_s: float = UNCLAIMED_EXIT_S) -> None:
        import multiprocessing

        self._scratch = contextlib.ExitStack()  # TileLang's temporaries and the fork server's socket
        self._scratch.enter_context(procs.run_scratch())
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # compiling never touches a GPU, and a fork server must not
        _no_main_in_children()
        self._ctx = multiprocessing.get_context("forkserver")
        self._preload = ["autotuner.ray_cluster", "tilelang", *preload]
        self._ctx.set_forkserver_preload(self._preload)
        self._running: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._t0 = time.time()
        self._failed: str | None = None
        self._closing = False
        self._starting = threading.Thread(target=self._start, name="tilecarve-forkserver-start", daemon=True)
        self._starting.start()  # at once, not at the first call
        self._claimed = _end_unless_claimed(self.shutdown, "compile host", unclaimed_exit_s, self._starting)

    def _start(self) -> None:
        """Start the fork server (it imports what it preloads) by forking one child from it."""
        try:
            p = self._ctx.Process(target=_noop, daemon=True)
            p.start()
            p.join()
            if p.exitcode != 0:
                self._failed = (f"its fork server's first child exited with code {p.exitcode} (could it import "
                                f"{', '.join(self._preload)}?)")
        except Exception as e:  # noqa: BLE001 - told by ready(), to the driver
            self._failed = format_error(e)

    def ready(self) -> dict[str, Any]:
        """Once the fork server is up: where this host runs (node, pid) and how long its start took. Raises
        if the fork server could not start."""
        import ray

        self._starting.join()
        if self._failed is not None:
            raise RuntimeError(f"the compile host on {ray.util.get_node_ip_address()} could not start its fork "
                               f"server: {self._failed}")
        return {"node": ray.util.get_node_ip_address(), "pid": os.getpid(), "up_s": time.time() - self._t0,
                "scratch": procs.current_scratch()}

    def claim(self) -> None:
        """A job took this host: it no longer ends itself when no compile comes."""
        self._claimed.set()

    def keep(self, after: float) -> str | None:
        """Its run is over: end any compile still running, and wait ``after`` seconds for another run of the
        driver's, then end (:meth:`shutdown`). The fork server stays, its imports done. The reason it cannot
        serve another run (:meth:`rearm`), or ``None``."""
        with self._lock:
            running = list(self._running.values())
        for child in running:
            with contextlib.suppress(Exception):
                child.terminate()
        return self.rearm(after)

    def rearm(self, after: float) -> str | None:
        """Taken, or kept, for a run that has not called it yet: end unless one does within ``after`` seconds.
        Refused (the reason is returned) when a module its fork server imported may have changed since
        (:func:`_stale`, asked of a child of the fork server, which has the server's modules)."""
        recv, send = self._ctx.Pipe(duplex=False)
        child = self._ctx.Process(target=_report_stale, args=(send, self._t0), daemon=True)
        try:
            child.start()
            send.close()
            stale = recv.recv() if recv.poll(HOST_SHUTDOWN_S) else "its fork server did not answer"
        except Exception as e:  # noqa: BLE001 - the fork server is gone: not fit for another run
            stale = f"its fork server failed ({_headline(e)})"
        finally:
            recv.close()
            if child.pid is not None:
                child.join(HOST_SHUTDOWN_S)
        if stale is None:
            self._claimed = _rearmed(self._claimed, self.shutdown, "compile host", after)
        return stale

    def compile(self, *task: Any) -> CompileOutcome:
        """:func:`.compile.compile_task` of ``task`` in a child of the fork server. Raises only for what is the
        host's fault (its fork server gone, or it is shutting down); a config the fork server cannot be sent
        is that config's ``compile_error``."""
        import pickle

        self._claimed.set()
        t0 = time.perf_counter()
        with self._lock:  # started and registered at once: shutdown() ends every child it may have
            if self._closing:
                raise RuntimeError("this compile host is shutting down")
            recv, send = self._ctx.Pipe(duplex=False)
            child = self._ctx.Process(target=_hosted_compile, args=(send, *task), daemon=True)
            try:
                child.start()  # pickles the task (the driver's cloudpickle carried it here) before it asks the server
            except Exception as e:
                recv.close()
                send.close()
                try:
                    pickle.dumps(task[4])
                except Exception:  # noqa: BLE001 - the config itself: a lambda or a notebook's class in it
                    return CompileOutcome(task[3], Status.COMPILE_ERROR, "this config cannot be sent to its compile "
                                          f"process (pickle fails on it: {format_error(e)}); a config holds plain "
                                          "values", time.perf_counter() - t0)
                raise  # the host's (its fork server), or what every config shares
            self._running[child.pid] = child
        send.close()
        out = None
        try:
            out = recv.recv()
        except EOFError:
            pass
        finally:
            recv.close()
            child.join()
            with self._lock:
                self._running.pop(child.pid, None)
        return out if out is not None else CompileOutcome(
            task[3], Status.COMPILE_ERROR, f"the compile process (pid {child.pid}) died with exit code "
            f"{child.exitcode} while compiling this config: killed from outside, e.g. by the OOM killer",
            time.perf_counter() - t0)

    def shutdown(self) -> int:
        """End every compile running here (their compile children first), remove this host's scratch directory
        and stop the fork server; how many compiles there were. No compile starts after it. The driver calls
        it before it kills the host."""
        with self._lock:
            self._closing = True
            running = list(self._running.values())
        for child in running:
            with contextlib.suppress(Exception):
                child.terminate()
        deadline = time.monotonic() + HOST_SHUTDOWN_S
        for child in running:
            child.join(max(0.0, deadline - time.monotonic()))
        self._scratch.close()  # first: the fork server's stop may not return in time
        stopper = threading.Thread(target=_stop_fork_server, name="tilecarve-forkserver-stop", daemon=True)
        stopper.start()
        stopper.join(HOST_SHUTDOWN_S)
        return len(running)

    def end(self) -> None:
        """:meth:`shutdown`, then end this actor for good: a host started for a job that did not take it."""
        import ray

        try:
            self.shutdown()
        finally:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


def _stop_fork_server() -> None:
    """Stop this process's fork server (its own way out, 3.8+; it also ends with this process)."""
    from multiprocessing import forkserver

    with contextlib.suppress(Exception):
        forkserver._forkserver._stop()


def _noop() -> None:
    return None


def _report_stale(send: Any, since: float) -> None:
    """A child of a compile host's fork server: send :func:`_stale` of the modules it has from the server."""
    send.send(_stale(since))
    send.close()


def _no_main_in_children() -> None:
    """Have this process's multiprocessing children not run its ``__main__`` again. A child of the fork server
    re-imports the parent's main module as ``__mp_main__`` (what ``spawn`` does, for a script's functions);
    in a Ray actor that is Ray's ``default_worker.py``, which imports Ray: 0.8 s of every compile (measured on a
    2-core machine, 2026-11-28, against 0.07-0.12 s for the compile itself). Nothing a compile child runs lives
    there. For this process only, which is a :class:`CompileHost`'s own actor."""
    from multiprocessing import spawn

    if getattr(spawn.get_preparation_data, "_tilecarve", False):
        return
    full = spawn.get_preparation_data

    def without_main(name: str) -> dict[str, Any]:
        data = full(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    without_main._tilecarve = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = without_main


def _hosted_compile(send: Any, *task: Any) -> None:
    """A :class:`CompileHost`'s compile child: SIGTERM, or the end of the host that asked for it (its
    multiprocessing parent, whose sentinel it watches; its OS parent is the fork server), kills its compile
    child's group and ends it (:func:`.procs.worker_init`)."""
    import multiprocessing

    procs.worker_init(None, sentinel=multiprocessing.parent_process().sentinel)
    try:
        out = compile_task(*task)
    except BaseException as e:  # noqa: BLE001 - a fault here is this config's, reported rather than lost
        out = CompileOutcome(task[3], Status.COMPILE_ERROR, f"the compile process failed: {format_error(e)}", 0.0)
    send.send(out)
    send.close()


@dataclass
class _Host(_Spare):
    """A :class:`CompileHost` actor as the driver sees it: its node, its slots, the CPUs it reserved, and
    whether it is up yet."""

    node: str = ""
    slots: int = 1
    cpus: int = 1
    up: Any = None  # its ready() call: an object ref until it answered, then True (False: it is gone)
    preload: tuple[str, ...] = ()  # the modules its fork server imported
    ending: Any = None  # its end() call, once closed (:func:`_end_kept_hosts` waits for it)
    busy: int = 0
    solo: bool = False  # compiling a config alone (:class:`_HostPool`): nothing else is handed to it
    replaces: bool = False  # started in place of a lost host

    def alive(self) -> bool:
        return super().alive() and self.up is not False

    def close(self) -> None:
        """End it the way it ends itself (:meth:`CompileHost.end`: its compiles, fork server and scratch
        directory first); a spare no job took."""
        import ray

        if self.mine():
            up = self.up is True or (self.up not in (None, False) and ray.wait([self.up], timeout=0)[0])
            if up:
                self.ending = self.actor.end.remote()
            else:  # not up (maybe still waiting for CPUs): nothing of it to clean
                self.kill()

    def kill(self) -> None:
        super().close()


def host_slots(ray: Any, n_jobs: int | None) -> dict[str, int]:
    """Compile slots per alive node (its id): every CPU of the node for ``n_jobs`` ``None`` or -1, else
    ``n_jobs`` shared over the nodes in proportion to their CPUs (the largest remainders get the rest)."""
    cpus = {n["NodeID"]: int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")}
    cpus = {k: v for k, v in cpus.items() if v > 0}
    if not cpus:
        raise ValueError("backend='ray': the Ray cluster has no CPUs to compile on (no alive node has 'CPU')")
    total = sum(cpus.values())
    if n_jobs in (None, -1) or n_jobs >= total:
        return cpus
    n = max(1, n_jobs)
    share = {k: v * n // total for k, v in cpus.items()}
    for k in sorted(cpus, key=lambda k: -(cpus[k] * n % total))[:n - sum(share.values())]:  # largest remainders
        share[k] += 1
    return {k: v for k, v in share.items() if v > 0}


def free_cpus(ray: Any) -> dict[str, float]:
    """CPUs no Ray task or actor holds now, per alive node; ``{}`` where Ray does not tell (it is asked
    through ``ray._private.state``, Ray's own per-node view, which has no public form)."""
    try:
        from ray._private import state

        return {node: float(have.get("CPU", 0.0)) for node, have in state.available_resources_per_node().items()}
    except Exception as e:  # noqa: BLE001 - a Ray without it: hosts reserve their slots
        logger.debug("Ray's free CPUs per node are unknown (%s)", _headline(e))
        return {}


def _kernel_modules(kernels: Sequence[Any]) -> list[str]:
    """The modules that define ``kernels`` (a template's ``functools.partial``: its function's and arguments')."""
    modules: dict[str, None] = {}
    for kernel in kernels:
        fn = getattr(kernel, "func", kernel)
        for x in (fn, *getattr(kernel, "args", ())):
            m = getattr(x, "__module__", None) if callable(x) else None
            if m and m != "__main__":
                modules[m] = None
    return list(modules)


def _start_host(ray: Any, node: str, slots: int, preload: list[str], cpus: int | None = None) -> _Host:
    """A :class:`CompileHost` on ``node`` with ``slots``, asked at once to start its fork server. It reserves
    ``cpus``, by default ``slots`` or the CPUs Ray reports free on the node if fewer (other Ray work holds
    the rest; a snapshot, which lags the cluster by a moment): asking for more would leave it waiting for
    them, and the run with it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if cpus is None:
        cpus = min(slots, int(free_cpus(ray).get(node, slots)))
        if cpus < slots:
            logger.info("node %s has %d free CPUs (other Ray work holds the rest): its compile host reserves those "
                        "and still runs up to %d compiles at once", node, cpus, slots)
    actor = ray.remote(CompileHost).options(
        num_cpus=cpus, max_concurrency=slots + 2, max_restarts=0, max_task_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        **run_options(ray)).remote(preload, UNCLAIMED_EXIT_S)
    host = _Host(actor, time.time(), _session(ray), node=node, slots=slots, cpus=cpus, preload=tuple(preload))
    host.up = actor.ready.remote()
    return host


def _new_hosts(ray: Any, preload: list[str], n_jobs: int | None) -> list[_Host]:
    """One :class:`CompileHost` per node that gets slots (:func:`host_slots`)."""
    return [_start_host(ray, node, slots, preload) for node, slots in host_slots(ray, n_jobs).items()]


#: The first element of a compile host's :mod:`.spares` kind, and of its kept kind (:func:`_keep`).
_HOSTS = "ray-compile"


def _spare_kind(n_jobs: int | None) -> tuple:
    """The :mod:`.spares` kind of the compile hosts of a run with ``n_jobs``: a run takes those started for
    its own ``n_jobs`` only (their slots were sized by it)."""
    return _HOSTS, None if n_jobs in (None, -1) else n_jobs


def prestart_compile_hosts(kernel: Any, n_jobs: int | None) -> None:
    """Have the compile hosts a job will take waiting (:mod:`.spares`): those an ended run of this process
    kept, when they fit the job (:func:`_kept_hosts`), else ones started now, so that their fork servers
    import TileLang and the kernel's modules while the job is planned."""
    ray = connect()
    if spares.count(_spare_kind(n_jobs)) == 0:
        preload = _kernel_modules([kernel])
        for host in _kept_hosts(ray, preload, n_jobs) or _new_hosts(ray, preload, n_jobs):
            spares.keep(_spare_kind(n_jobs), host)


def _kept_hosts(ray: Any, preload: list[str], n_jobs: int | None) -> list[_Host]:
    """The compile hosts an ended run of this process kept (:data:`KEEP_S`), for a run with ``n_jobs`` whose
    kernels' modules are ``preload``: all of them when they fit it (one per node that gets slots, with its
    slots, every one up, their fork servers having imported ``preload``), else none (they are ended: their
    CPUs go to the new hosts)."""
    kind = _spare_kind(n_jobs)
    _end_kept_hosts(but=kind)
    kept: list[_Host] = list(iter(functools.partial(_take_kept, kind), None))  # type: ignore[arg-type]
    if not (kept and {h.node: h.slots for h in kept} == host_slots(ray, n_jobs)
            and all(set(preload) <= set(h.preload) for h in kept)):
        _end_hosts(kept)
        return []
    if not _rearm_taken(kept):  # it ended them
        return []
    for h in kept:
        h.spawned = time.time()
    return kept


def _end_kept_hosts(but: tuple | None = None) -> None:
    """End the compile hosts ended runs kept, but those of kind ``but``: they hold CPUs a run's hosts need."""
    with _KEPT_LOCK:
        kinds = [k for k in _KEPT if k[0] == _HOSTS and k != but]
    _end_hosts([h for k in kinds for h in iter(functools.partial(_take_kept, k), None)])  # type: ignore[misc]


def _end_hosts(hosts: Sequence[_Host]) -> None:
    """End ``hosts`` and wait (a moment) for them to be gone: a host started next reserves the CPUs Ray
    reports free, which these hold until then. Those of an earlier Ray connection went with it: nothing to do
    (a Ray call now would start a new instance)."""
    import ray

    hosts = [h for h in hosts if h.mine()]
    for h in hosts:
        if h.ending is None:
            h.close()
    ends = [h.ending for h in hosts if h.ending is not None]
    if ends:
        ray.wait(ends, num_returns=len(ends), timeout=2 * HOST_SHUTDOWN_S)
    freed: dict[str, int] = {}
    for h in hosts:
        freed[h.node] = freed.get(h.node, 0) + h.cpus
    deadline = time.monotonic() + HOST_SHUTDOWN_S  # Ray's view of free CPUs lags the actors' end by a moment
    while freed and time.monotonic() < deadline:
        free = free_cpus(ray)
        if not free or all(free.get(node, 0.0) >= cpus for node, cpus in freed.items()):
            break
        time.sleep(0.1)


class RayBench(ServedBench):
    """What :class:`.bench.IsolatedBench` does for one device, done by a Ray actor (:class:`MeasuringActor`).

    The actor is one the plan created (:func:`prestart_actors`) when one is waiting, else created now; it
    is awaited at the first call, so its start overlaps compilation. After a death or a kill, the next
    call waits for Ray to restart it; one that is not back within :data:`RESTART_TIMEOUT_S` (or is dead
    for good) raises :class:`.devices.DeviceLost`.
    """

    def __init__(self, specs: list[BenchSpec], run_timeout: float, device: Device) -> None:
        super().__init__(specs, run_timeout)
        self.ray = connect()
        self.device = device
        kind = self.specs[0].device
        self._session = _session(self.ray)  # asked now: after ray.shutdown() a Ray call would start a new instance
        self._modules = frozenset(_kernel_modules([f for s in self.specs for f in (s.kernel, s.check.ref_prog) if f]))
        spare = spares.take(("ray", kind))
        if spare is None and (kept := _take_kept(("ray", kind), self._modules)) is not None and _rearm_taken([kept]):
            spare = kept  # none taken by a plan (a job's measuring side opened directly)
        self._modules |= spare.modules if spare is not None else frozenset()
        self._actor = spare.actor if spare is not None else _new_actor(self.ray, kind)
        self._kind = kind
        self._path = spare.path if spare is not None else _path_key()
        if spare is None or not spare.kept:
            self._stamps.append((spare.spawned if spare is not None else time.time(), "process spawned"))
        self._aborted = self._handed_back = False
        self._lock = threading.Lock()  # abort() from the pool's thread against close() keeping the actor
        self._payload = [self.ray.put(spec_payload(self.specs))]  # held here: a restart reads it again
        self._info = self._actor.info.remote()  # the first wait for the actor, ahead of what prepare queues
        self._actor.load.remote(self._payload)
        self._owed: list[tuple[Any, float]] = []  # prepare's calls and their bounds (s), in order
        self._wait: float | None = START_TIMEOUT_S  # seconds to wait for the actor at the next call; None: up
        self._started = False  # it has been up once
        global _OPEN_BENCHES
        with _KEPT_LOCK:  # until close() keeps or ends the actor
            _OPEN_BENCHES += 1

    def prepare(self, sid: int, config: dict[str, Any], elaborate_timeout: float) -> None:
        """Have the actor make problem ``sid``'s inputs for ``config`` while it waits for its first candidate
        (as :meth:`.bench.IsolatedBench.prepare`); returns at once."""
        if not self._owed:
            self._owed = [(self._actor.call.remote(("elaborate", sid, config), self._payload), elaborate_timeout),
                          (self._actor.call.remote(("make_inputs", sid), self._payload), self.run_timeout)]

    def _settle(self) -> None:
        """Wait for :meth:`prepare`'s calls, each within its bound, once the actor is up; one that does not
        end in time has the actor killed and restarted (no candidate pays), as
        :meth:`.bench.IsolatedBench._settle` replaces its process."""
        errors = self.ray.exceptions
        while self._owed:
            ref, bound = self._owed[0]
            done, _ = self.ray.wait([ref], timeout=bound)
            if not done:
                logger.warning("the Ray measuring actor %s took more than %g s making its first problem's inputs "
                               "ahead of its first candidate; it was restarted", self.device.label, bound)
                self._owed = []
                self.ray.kill(self._actor, no_restart=False)
                self._wait = RESTART_TIMEOUT_S
                self._up()
                return
            self._owed.pop(0)
            try:
                self.ray.get(ref)
            except (errors.RayActorError, errors.ObjectLostError):  # it died: the wait below finds it back
                self._owed = []
                self._wait = RESTART_TIMEOUT_S
                self._up()

    def _up(self) -> None:
        """Wait for the actor (its first start or a restart); check its device's model."""
        if self._wait is None:
            return
        errors = self.ray.exceptions
        deadline = time.monotonic() + self._wait
        died = 0
        ref, self._info = self._info, None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.abort()
                raise DeviceLost(f"its Ray actor was not up within {self._wait:g} s (its node lost, or no free "
                                 "GPU to restart it on)")
            try:
                info = self.ray.get(ref if ref is not None else self._actor.info.remote(), timeout=left)
                break
            except errors.GetTimeoutError:
                continue
            except errors.ActorUnavailableError:  # restarting: ask again
                ref = None
                time.sleep(min(1.0, left))
            except errors.ActorDiedError as e:
                ref = None
                if e.actor_init_failed and not self._started:  # the setup is wrong (e.g. the kernel's module
                    raise RuntimeError(f"the Ray measuring actor {self.device.label} could not start: {e}") \
                        from None  # cannot be imported on the workers): every device would fail alike
                died += 1
                if e.actor_init_failed or died >= DEAD_CALLS:
                    raise DeviceLost(f"its Ray actor is dead and does not restart: {_headline(e)}") from None
                time.sleep(1.0)  # a call that raced the actor's restart
        if self.device.name not in (ANY_MODEL, info["name"]):
            self.abort()
            raise ValueError(f"the Ray measuring actor {self.device.label} runs on {info['name']} (node "
                             f"{info['node']}), not on the target's {self.device.name}; timings on one do not "
                             "compare with timings on the other. Tune on a cluster of one model, or pass "
                             "set_tuning(allow_mixed_devices=True) to rank across them anyway")
        logger.info("%s: measuring on node %s, GPU %s (%s)", self.device.label, info["node"],
                    ",".join(info["gpus"]) or "-", info["name"])
        self._wait, self._started = None, True

    def _call(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        """``("ok", reply)``, ``("input_error", ...)``, ``("error", text)``, ``("died", why)`` or
        ``("timeout", why)``, as :meth:`.bench.IsolatedBench._call` answers."""
        self._up()
        self._settle()
        ref = self._actor.call.remote(msg, self._payload)
        done, _ = self.ray.wait([ref], timeout=timeout)
        if not done:
            self.ray.kill(self._actor, no_restart=False)
            self._wait = RESTART_TIMEOUT_S
            return "timeout", (f"kernel ran past run_timeout={timeout:g} s; its Ray measuring actor "
                               f"({self.device.label}) was killed and restarted")
        try:
            tag, reply = self.ray.get(ref)
            if tag == "lost":  # its context is gone: Ray restarts it, and the candidate counts as died
                self.ray.kill(self._actor, no_restart=False)
                self._wait = RESTART_TIMEOUT_S
                return "died", f"{reply}; its Ray measuring actor ({self.device.label}) was restarted"
            return tag, reply
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ObjectLostError) as e:
            self._wait = RESTART_TIMEOUT_S
            return "died", (f"the Ray measuring actor {self.device.label} died while running this config: a crash, "
                            f"a sticky CUDA error, or its node was lost ({_headline(e)}); Ray restarts it for "
                            "the remaining configs")

    def _is_up(self) -> bool:
        """Whether the actor has answered and has nothing owed: a release before then has nothing to free
        (and would wait for the actor's start)."""
        return self._wait is None and not self._owed

    def abort(self) -> None:
        """Kill the actor for good, from any thread: a call waiting on it returns as ``died``. Nothing once
        ``ray.shutdown()`` has ended it (Ray's calls would start a new instance)."""
        with self._lock:
            if self._handed_back:  # kept for the next run by close(): no longer this bench's
                return
            self._aborted = True
            if self.ray.is_initialized():
                self.ray.kill(self._actor, no_restart=True)

    def close(self) -> None:
        """Keep the actor for this process's next run (:data:`KEEP_S`) when it came up and was neither killed
        nor aborted, and it agrees (:meth:`MeasuringActor.keep`), within :data:`HOST_SHUTDOWN_S`; else end it
        now (it frees its GPU)."""
        global _OPEN_BENCHES
        try:
            with self._lock:
                if self._aborted or not self.ray.is_initialized():  # ray.shutdown() ended it
                    return
                up = self._wait is None or (not self._started and self._info is not None
                                            and bool(self.ray.wait([self._info], timeout=0)[0]))
                if up:
                    try:
                        why = self.ray.get(self._actor.keep.remote(KEEP_S), timeout=HOST_SHUTDOWN_S)
                    except BaseException as e:  # noqa: BLE001 - it does not answer, or Ray is shutting down
                        why = _headline(e)
                    if why is None:
                        _keep(("ray", self._kind), _Spare(self._actor, time.time(), self._session, path=self._path,
                                                          modules=self._modules))
                        self._handed_back = True
                        return
                    logger.debug("the Ray measuring actor %s is not kept: %s", self.device.label, why)
            self.abort()
        finally:
            with _KEPT_LOCK:
                _OPEN_BENCHES -= 1
                _KEPT_LOCK.notify_all()


def _headline(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def compile_on_ray(tasks: list[tuple], n_jobs: int | None, kernels: Sequence[Any]) -> Iterator[CompileOutcome]:
    """Run :func:`.compile.compile_task` for each argument tuple of ``tasks`` (compiling ``kernels``) on the
    cluster's compile hosts (:class:`CompileHost`: the ones the plan started for this ``n_jobs``, else new
    ones, one per node); yield outcomes as they finish. At most ``n_jobs`` run at once (``None`` or -1: as
    many as the hosts have slots), handed out in order to whichever host is up and has a free slot.

    A host that is lost (its node, or its actor killed) has its running compiles handed out again, and is
    started again, on its node while that node is alive, else on another (at most :data:`HOST_RESTARTS`
    times per node). A host's loss is not taken as the fault of the configs it was compiling: one in flight
    at :data:`COMPILE_RETRIES` losses is then compiled alone on its host, and only one whose host is lost
    while compiling it alone is a ``compile_error``. With no host left, and none that can be started, this
    raises rather than record configs it did not try: the trials recorded so far stay, and a re-run resumes.
    Stopping early (``close()``, an exception in the consumer) ends every compile still running. The hosts
    are ended when this ends."""
    ray = connect()
    preload = _kernel_modules(kernels)
    hosts: list[_Host] = []
    while (spare := spares.take(_spare_kind(n_jobs))) is not None:
        hosts.append(spare)
    if not hosts:  # none started by a plan (compile_many called directly)
        hosts = _kept_hosts(ray, preload, n_jobs) or _new_hosts(ray, preload, n_jobs)
    _end_kept_hosts()  # others' (another n_jobs): they hold CPUs these hosts need
    done = False
    kept: set[int] = set()
    try:
        yield from _HostPool(ray, hosts, preload, n_jobs).run(tasks)
        done = True
    finally:
        try:
            if done:
                kept = {id(h) for h in _keep_hosts(ray, hosts, n_jobs)}
        finally:  # even on Ctrl-C
            try:
                ends = [h.actor.shutdown.remote() for h in hosts if h.up is not False and id(h) not in kept]
                ray.wait(ends, num_returns=len(ends), timeout=HOST_SHUTDOWN_S)
            finally:  # even on a second Ctrl-C
                for host in hosts:
                    if id(host) not in kept:
                        host.kill()


def _keep_hosts(ray: Any, hosts: list[_Host], n_jobs: int | None) -> list[_Host]:
    """After a run that compiled everything: keep its hosts for this process's next run (:data:`KEEP_S`) when
    every one still running is up and agrees (:meth:`CompileHost.keep`), and no plan's hosts of another
    ``n_jobs`` are waiting for CPUs (they would wait for these); else none (the caller ends them all)."""
    up = [h for h in hosts if h.up is not False]
    if not up or any(h.up is not True or h.cpus < h.slots for h in up):  # one started short of CPUs: not kept
        return []
    if any(k[0] == _HOSTS and k != _spare_kind(n_jobs) for k in spares.kinds()):
        return []
    refused = _refusal(ray, [h.actor.keep.remote(KEEP_S) for h in up])
    if refused is not None:
        logger.debug("the compile hosts are not kept: %s", refused)
        return []
    for h in up:
        h.busy, h.solo, h.replaces = 0, False, False
        _keep(_spare_kind(n_jobs), h)
    return up


class _HostPool:
    """One :func:`compile_on_ray` call's hosts (``hosts``, to which it adds those it starts again) and the
    compiles running on them."""

    def __init__(self, ray: Any, hosts: list[_Host], preload: list[str], n_jobs: int | None) -> None:
        self.ray, self.hosts, self.preload = ray, hosts, preload
        self.limit = n_jobs if n_jobs not in (None, -1) else sum(h.slots for h in hosts)
        self.running: dict[Any, tuple[_Host, tuple, float]] = {}  # ref -> (its host, its task, handed out at)
        self.restarts: dict[str, int] = {}  # node -> hosts started again there
        self.losses: list[str] = []  # what happened to each host lost or not started, for the final error
        self.t0 = time.monotonic()
        self.told = False  # that no host is up yet
        for host in hosts:
            host.actor.claim.remote()

    def run(self, tasks: list[tuple]) -> Iterator[CompileOutcome]:
        ray = self.ray
        stored: dict[int, tuple[Any, Any, Any]] = {}  # each kernel (one per batch of a job) stored once
        for task in tasks:
            if id(task[0]) not in stored:
                stored[id(task[0])] = tuple(ray.put(x) for x in task[:3])
        self.queue, self.tries = deque(tasks), dict.fromkeys(range(len(tasks)), 0)
        queue = self.queue
        while queue or self.running:
            for host in self.hosts:
                while queue and host.up is True and not host.solo and host.busy < host.slots \
                        and len(self.running) < self.limit:
                    task = self._next(idle=not host.busy)
                    if task is None:
                        break
                    if self.tries[task[3]] >= COMPILE_RETRIES:  # a suspect: alone on its host
                        host.solo = True
                    ref = host.actor.compile.remote(*stored[id(task[0])], *task[3:])
                    self.running[ref] = (host, task, time.perf_counter())
                    host.busy += 1
            starting = {h.up: h for h in self.hosts if h.up is not True and h.up is not False}
            if not self.running and not starting:
                self._none_left()
            done, _ = ray.wait([*self.running, *starting], num_returns=1, timeout=self._wait_s(starting))
            if not done:
                self._check_starting(starting)
            for ref in done:
                if ref in starting:
                    self._started(starting[ref])
                    continue
                host, task, t0 = self.running.pop(ref)
                alone = host.solo
                host.busy -= 1
                host.solo = False
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as e:  # the host's (lost, its fork server gone), not the config's
                    self._lost(host, e, explained=alone)
                    self.tries[task[3]] += 1
                    if alone:
                        yield CompileOutcome(task[3], Status.COMPILE_ERROR, f"the Ray compile host compiling this "
                                             f"config was lost {self.tries[task[3]]} times, the last one while it "
                                             f"compiled this config alone ({_cause(e)})", time.perf_counter() - t0)
                    else:  # behind the configs not yet tried, so that it meets other neighbours next time
                        queue.append(task)
                    continue
                yield outcome

    def _next(self, idle: bool) -> tuple | None:
        """The next task for a host: the queue's first for an idle one; for a busy one the first that is not a
        suspect (one of those runs alone), or ``None``."""
        queue = self.queue
        if idle or self.tries[queue[0][3]] < COMPILE_RETRIES:
            return queue.popleft()
        for i, task in enumerate(queue):
            if self.tries[task[3]] < COMPILE_RETRIES:
                del queue[i]
                return task
        return None

    def _none_left(self) -> None:
        """Raise: no host is up or starting, and none can be started."""
        raise RuntimeError(f"no Ray compile host is left for this run ({'; '.join(self.losses) or 'none started'}); "
                           f"{len(self.queue)} config(s) were not compiled. The trials recorded so far are kept: run "
                           "again to resume from them")

    def _wait_s(self, starting: dict[Any, _Host]) -> float | None:
        """How long to wait for an outcome or a host: until the next starting host's deadline, or the time to
        say that none is up yet."""
        if not starting:
            return None
        marks = [h.spawned + HOST_START_TIMEOUT_S - time.time() for h in starting.values()]
        if not self.told and not self.running:
            marks.append(self.t0 + HOST_PENDING_LOG_S - time.monotonic())
        return max(0.05, min(marks))

    def _check_starting(self, starting: dict[Any, _Host]) -> None:
        """Say once what the run waits for when no host is up yet; give up on a host past its start deadline."""
        if not self.told and not self.running and time.monotonic() - self.t0 >= HOST_PENDING_LOG_S:
            self.told = True
            logger.warning("no Ray compile host is up %.0f s into the run; waiting for %d on node(s) %s (each imports "
                           "TileLang and the kernels' modules first; one that cannot get its CPUs waits for them)",
                           time.monotonic() - self.t0, len(starting), ", ".join(h.node for h in starting.values()))
        for host in starting.values():
            if time.time() - host.spawned > HOST_START_TIMEOUT_S:
                self._gone(host, f"the host on node {host.node} did not come up within {HOST_START_TIMEOUT_S:g} s "
                                 "(the cluster's CPUs held by other work, or the node cannot start the actor)")

    def _started(self, host: _Host) -> None:
        """``host``'s ready() answered: it is up, or it could not start."""
        try:
            info = self.ray.get(host.up)
        except self.ray.exceptions.RayError as e:
            self._gone(host, f"the host on node {host.node} could not start: {_cause(e)}")
            return
        host.up = True
        logger.debug("compile host on %s up in %.2f s (%d slots)", info["node"], info["up_s"], host.slots)

    def _gone(self, host: _Host, why: str) -> None:
        """``host`` will not come up: compile on the others (a host started in place of a lost one is started
        again elsewhere, :meth:`_replace`), or raise when none is left."""
        host.up = False
        host.kill()
        self.losses.append(why)
        logger.warning("a Ray compile host did not start (%s); compiling on the others", why)
        if host.replaces:
            self._replace(host, avoid=host.node)
        if all(h.up is False for h in self.hosts):
            self._none_left()

    def _lost(self, host: _Host, e: BaseException, explained: bool = False) -> None:
        """``host`` failed a compile call: it is taken as lost (and killed, should it still run), and started
        again (:meth:`_replace`). ``explained``: it was compiling a suspect alone, which is convicted: that loss,
        and the two it was in flight at before, are not charged to the node's restarts."""
        if host.up is not True:  # told already, by another of its compiles
            return
        host.up = False
        host.kill()
        self.losses.append(f"the host on node {host.node} was lost ({_cause(e)})")
        if explained:
            self.restarts[host.node] = max(0, self.restarts.get(host.node, 0) - 3)
        node = self._replace(host)
        logger.warning("the Ray compile host on node %s was lost (%s); its compiles go to %s", host.node, _cause(e),
                       f"a host started again on node {node}" if node else "the other hosts")

    def _replace(self, lost: _Host, avoid: str | None = None) -> str | None:
        """Start a host in place of ``lost`` (:meth:`_restart_node`, not on ``avoid``): on its node with its slots
        and the CPUs it had, elsewhere with at most that node's CPUs. The node, or ``None``."""
        node = self._restart_node(lost.node, avoid)
        if node is None:
            return None
        self.restarts[node] = self.restarts.get(node, 0) + 1
        if node == lost.node:
            new = _start_host(self.ray, node, lost.slots, self.preload, cpus=lost.cpus)  # its CPUs were its own
        else:
            cpus = {n["NodeID"]: int(n.get("Resources", {}).get("CPU", 0)) for n in self.ray.nodes()}
            new = _start_host(self.ray, node, max(1, min(lost.slots, cpus.get(node, 1))), self.preload)
        new.replaces = True
        new.actor.claim.remote()
        self.hosts.append(new)
        return node

    def _restart_node(self, lost: str, avoid: str | None = None) -> str | None:
        """Where to start a lost host again: its node while alive, else an alive node without a host of this
        run up or starting (the most CPUs first), else ``None``; a node at most :data:`HOST_RESTARTS` times
        (a loss a convicted config explains is not counted), never ``avoid`` (where a replacement failed)."""
        nodes = [n for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] != avoid]
        held = {h.node for h in self.hosts if h.up is not False}
        order = [lost] + [n["NodeID"] for n in sorted(nodes, key=lambda n: -n.get("Resources", {}).get("CPU", 0))
                          if n["NodeID"] not in held]
        alive = {n["NodeID"] for n in nodes}
        return next((n for n in order if n in alive and self.restarts.get(n, 0) < HOST_RESTARTS), None)


def _cause(e: BaseException) -> str:
    """What a Ray error says happened: a task's own exception (``RayTaskError.cause``), else its headline."""
    cause = getattr(e, "cause", None)
    return _headline(cause) if isinstance(cause, BaseException) else _headline(e)
