"""Tuning on a Ray cluster (``set_tuning(backend="ray")``): compile tasks and one measuring actor per GPU.

* **Which cluster.** The Ray instance this process is already connected to (the user called
  ``ray.init``), else the cluster ``RAY_ADDRESS`` names, else a local instance started here, without
  the dashboard; it stays up for later runs of this process (``ray.shutdown()`` ends it).
* **Compiling.** One Ray task per config (``num_cpus=1``; ``n_jobs`` bounds how many run at once, and
  at first only a few per GPU run, on the workers the plan readied: :func:`compile_slots`),
  running the very :func:`.compile.compile_task` a local worker runs: a killable child per compile,
  with its timeout, forked from the Ray worker's own loky worker (a fresh interpreter), never from the
  Ray worker (:mod:`.forking`). The kernel travels as it does to joblib workers (cloudpickle, with the globals it
  needs and a notebook kernel's source), once per run through Ray's object store. Outcomes come back
  as they finish. A task lost with its worker or node is retried by Ray, then recorded as a
  ``compile_error``.
* **Measuring.** One actor per device: ``num_gpus=1`` (Ray pins it to its GPU), no CPU reserved, so
  the compile tasks keep every core; on the C target a fake device that reserves nothing. Each actor
  holds a :class:`.bench.Benches` (every problem of the job) and plays the part of one isolated measuring process behind
  :class:`.devices.DevicePool`'s queue (:class:`RayBench`). A kernel that crashes its actor costs its
  candidate (``runtime_error``) and Ray restarts the actor; one that runs past ``run_timeout`` gets
  the actor killed and restarted (``timeout``). An actor that cannot come back, its node gone and no
  GPU free, is dropped (:class:`.devices.DeviceLost`) and the run finishes on the others.
* **The database stays on the driver** (this process): each trial is written as it arrives, so a lost
  node costs its in-flight candidates only, and a re-run resumes from the recorded trials.

Workers import what this process imports: their ``PYTHONPATH`` is this process's ``sys.path``, and
they share its ``TILELANG_CACHE_DIR`` if one is set, so a candidate compiled by a task on the same
machine is a disk-cache hit for the actor that measures it. On other machines the actor compiles the
candidate again unless that directory is on a shared file system.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import procs, spares
from .bench import Benches, BenchSpec, ServedBench, load_specs, serve_one, spec_payload, start_device
from .compile import CompileOutcome, cloudpickle_module, compile_task, fork_free, kernel_sources, warm_worker
from .devices import Device, DeviceLost, device_name
from .trial import Status

__all__ = ["ANY_MODEL", "MeasuringActor", "RayBench", "compile_on_ray", "compile_slots", "connect", "prestart_actors",
           "resolve_ray_devices", "warm_compile_workers", "worker_runtime_env"]

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
#: How often Ray retries a compile task whose worker or node died.
COMPILE_RETRIES = 2
#: Compile slots a run opens first: this many per GPU of the cluster, and at least :data:`MIN_FIRST_SLOTS`.
#: From TileLang's disk cache a compile takes 0.1-0.3 s, so a few workers per GPU keep its measuring actor
#: fed, and every extra worker would only import TileLang (3-13 s each, the more at once the slower: on a
#: 32-core host, 54 workers importing at once held the first compile back to 12.9 s) while the actors
#: import theirs. Every slot of ``n_jobs`` opens once a compile takes :data:`REAL_COMPILE_S` or more.
FIRST_SLOTS_PER_GPU = 4
MIN_FIRST_SLOTS = 8
#: A compile (as its task measured it) this long or longer was not a disk-cache hit: open every slot.
REAL_COMPILE_S = 1.0


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
    local instance is). Then Ray's idle workers, started with the cluster, run the actors and compile tasks
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

    def __init__(self, device: str) -> None:
        # TileLang's .cpp/.so pairs of a candidate compiled here (a node other than its compile task's)
        # go to a scratch directory of this actor's; the next run on this node sweeps it once the actor is gone
        up = time.time()
        self._scratch = contextlib.ExitStack()
        self._scratch.enter_context(procs.run_scratch())
        self.device = device
        self._stamps = [(up, "process up"), *start_device(device)]  # a job's timeline
        self.benches: Benches | None = None

    def _benches(self, payload: list) -> Benches:
        """The job's :class:`.bench.Benches`, made from ``payload[0]`` (an object reference) at the first call."""
        if self.benches is None:
            import ray

            self.benches = Benches(load_specs(*ray.get(payload[0])))
            self.benches.stamps += [*self._stamps, (time.time(), "imports done")]
        return self.benches

    def info(self) -> dict[str, Any]:
        """Where this actor runs: its device's model, its node and Ray's GPU ids for it."""
        import ray

        return {"name": device_name(self.device, 0), "node": ray.util.get_node_ip_address(),
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def load(self, payload: list) -> None:
        """Unpickle the job's specs now (importing the kernels' modules), not at the first request."""
        self._benches(payload)

    def call(self, msg: tuple, payload: list) -> tuple[str, Any]:
        return serve_one(self._benches(payload), msg)


@dataclass
class _SpareActor:
    """A measuring actor created during the plan (:func:`prestart_actors`), waiting for its job."""

    actor: Any
    spawned: float
    job: str  # the Ray session (:func:`_session`: this process's connection to Ray) it was created in

    def alive(self) -> bool:
        """Whether a job may take it: it belongs to this process's current Ray connection (an actor of an
        earlier ``ray.init`` went with its ``ray.shutdown``). One that died is restarted by Ray; the job's
        first call finds out."""
        import ray

        return ray.is_initialized() and _session(ray) == self.job

    def close(self) -> None:
        import ray

        if self.alive():
            ray.kill(self.actor, no_restart=True)


def _new_actor(ray: Any, device: str) -> Any:
    """A measuring actor for ``device`` (``"cuda"``: one GPU; ``"cpu"``: a fake device reserving nothing)."""
    gpu = {"num_gpus": 1} if device == "cuda" else {}
    return ray.remote(MeasuringActor).options(num_cpus=0, **gpu, max_restarts=-1, max_task_retries=0,
                                              **run_options(ray), name=None).remote(device)


def prestart_actors(n: int, device: str) -> None:
    """Create, now, the ``n`` measuring actors a job on ``device`` will take (:mod:`.spares`), unless they
    are waiting already, so that their workers start and import while the job is planned."""
    ray = connect()
    job = _session(ray)
    for _ in range(n - spares.count(("ray", device))):
        spares.keep(("ray", device), _SpareActor(_new_actor(ray, device), time.time(), job))


#: The last warm-up tasks of :func:`warm_compile_workers` (kept so that nothing cancels them) and their Ray
#: session (:func:`_session`: a ref of an earlier one is unknown to Ray, and ``ray.wait`` raises on it).
_WARMING: list[Any] = []
_WARMING_JOB: list[str] = []
#: Seconds a run's compiles wait for the warm-ups before they take any worker Ray gives them.
WARM_WAIT_S = 60.0
#: What the workers were readied for: (Ray session, the kernel's modules).
_WARMED: set[tuple] = set()


def compile_slots(ray: Any, n_jobs: int | None, n_tasks: int | None = None) -> tuple[int, int]:
    """``(first, every)``: the compile tasks a run keeps in flight at first, and once a real compile is seen
    (:data:`FIRST_SLOTS_PER_GPU`). ``every`` is ``n_jobs``, or (``None``, -1) as many as the cluster has CPUs,
    at most ``n_tasks``."""
    have = ray.cluster_resources()
    every = n_jobs if n_jobs not in (None, -1) else int(have.get("CPU", 1))
    every = max(1, min(every, n_tasks) if n_tasks else every)
    return min(every, max(MIN_FIRST_SLOTS, FIRST_SLOTS_PER_GPU * int(have.get("GPU", 0)))), every


def _ray_compile(kind: str, *args: Any) -> Any:
    """The one remote function of a run's compile side: ``"warm"`` runs :func:`.compile.warm_worker`, else
    :func:`.compile.compile_task`. One function, so one Ray scheduling class: the workers leased for the
    warm-ups are the ones the compiles queue on, not new workers started beside them. Either runs in the
    Ray worker's loky worker (:func:`.compile.fork_free`), because a Ray worker forks no Python child
    (:mod:`.forking`): the warm-up starts that worker, and each compile forks its child from it."""
    return fork_free(warm_worker if kind == "warm" else compile_task, *args)


def _compile_remote(ray: Any) -> Any:
    return ray.remote(_ray_compile).options(num_cpus=1, max_retries=COMPILE_RETRIES, **run_options(ray))


def warm_compile_workers(kernel: Any, n_jobs: int | None) -> None:
    """Ready the Ray workers the compile tasks will run on first, now: one task per first compile slot
    (:func:`compile_slots`) running :func:`.compile.warm_worker` through the compile tasks' own remote
    function (:func:`_ray_compile`), so that each worker imports TileLang and the kernel's modules while
    the job is planned rather than in its first compile task. Once per Ray session and kernel modules (the
    plans of a model's problems share theirs). Returns at once."""
    ray = connect()
    fn = getattr(kernel, "func", kernel)  # functools.partial: a template's kernel
    modules = {getattr(x, "__module__", None) for x in (fn, *getattr(kernel, "args", ())) if callable(x)}
    what = (_session(ray), frozenset(m for m in modules if m))
    if what in _WARMED:
        return
    _WARMED.add(what)
    first, _ = compile_slots(ray, n_jobs)
    remote = _compile_remote(ray)
    payload = ray.put(cloudpickle_module().dumps(kernel))
    _WARMING[:] = [remote.remote("warm", payload, kernel_sources(kernel), os.getpid()) for _ in range(first)]
    _WARMING_JOB[:] = [what[0]]


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
        spare = spares.take(("ray", kind))
        self._actor = spare.actor if spare is not None else _new_actor(self.ray, kind)
        self._stamps.append((spare.spawned if spare is not None else time.time(), "process spawned"))
        self._payload = [self.ray.put(spec_payload(self.specs))]  # held here: a restart reads it again
        self._info = self._actor.info.remote()  # the first wait for the actor, ahead of what prepare queues
        self._actor.load.remote(self._payload)
        self._owed: list[tuple[Any, float]] = []  # prepare's calls and their bounds (s), in order
        self._wait: float | None = START_TIMEOUT_S  # seconds to wait for the actor at the next call; None: up
        self._started = False  # it has been up once

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

    def abort(self) -> None:
        """Kill the actor for good, from any thread: a call waiting on it returns as ``died``."""
        self.ray.kill(self._actor, no_restart=True)

    def close(self) -> None:
        """End the actor now (it frees its GPU); nothing of it is needed after the run."""
        self.abort()


def _headline(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def compile_on_ray(tasks: list[tuple], n_jobs: int | None) -> Iterator[CompileOutcome]:
    """Run :func:`.compile.compile_task` on Ray for each argument tuple of ``tasks``; yield outcomes as
    they finish. At most ``n_jobs`` run at once (``None`` or -1: as many as the cluster has CPUs), and at
    first only as many as the warm-ups readied (:func:`compile_slots`), each queued once a warm-up has
    ended, so that it runs on that worker (within :data:`WARM_WAIT_S`): the rest open once a compile is a
    real one rather than a disk-cache hit. Stopping early (``close()``, an exception in the consumer)
    cancels the rest, killing running ones."""
    ray = connect()
    lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
            ray.exceptions.OutOfMemoryError)
    remote = _compile_remote(ray)
    stored: dict[int, tuple[Any, Any, Any]] = {}  # each kernel (one per batch of a job) stored once
    for task in tasks:
        if id(task[0]) not in stored:
            stored[id(task[0])] = tuple(ray.put(x) for x in task[:3])
    queue = deque(tasks)
    first, every = compile_slots(ray, n_jobs, len(tasks))
    # this job's warm-ups still running: a compile queued now would have Ray start a new worker for it
    warming = set(_WARMING) if _WARMING_JOB == [_session(ray)] else set()
    warming -= set(ray.wait(list(warming), num_returns=len(warming), timeout=0)[0]) if warming else set()
    limit = max(0, first - len(warming))  # more warm-ups than tasks (first == every): a slot per warm-up done
    wait_until = time.monotonic() + WARM_WAIT_S
    running: dict[Any, tuple[int, float]] = {}  # ref -> (config index, submitted at)
    try:
        while queue or running:
            if warming and time.monotonic() > wait_until:
                logger.debug("the Ray compile workers' warm-ups are not done after %g s: compiling on any worker",
                             WARM_WAIT_S)
                limit, warming = max(limit, first), set()
            while queue and len(running) < (limit if warming else max(1, limit)):
                task = queue.popleft()
                running[remote.remote("compile", *stored[id(task[0])], *task[3:])] = (task[3], time.perf_counter())
            done, _ = ray.wait([*running, *warming], num_returns=1,
                               timeout=max(0.0, wait_until - time.monotonic()) if warming else None)
            for ref in done:
                if ref in warming:  # its worker is free, ready for a compile
                    warming.discard(ref)
                    limit = min(every, limit + 1)
                    continue
                index, t0 = running.pop(ref)
                try:
                    out = ray.get(ref)
                except lost as e:
                    out = CompileOutcome(index, Status.COMPILE_ERROR, f"the Ray compile task for this config was "
                                         f"lost with its worker or node, {COMPILE_RETRIES} retries included "
                                         f"({_headline(e)})", time.perf_counter() - t0)
                if out.seconds >= REAL_COMPILE_S and limit < every:
                    logger.debug("a compile took %.1f s (not a cache hit): opening all %d compile slots",
                                 out.seconds, every)
                    limit = every
                yield out
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
