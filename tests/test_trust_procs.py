"""Nothing a tuning run starts outlives it, and it leaves no temporary files behind (C target).

The process tests run a tuning script in its own session (as a terminal would run it), with a
marker in its environment that every descendant inherits: compile workers, compile children and
their compilers, the measuring process, resource trackers, and the ``sleep`` that the hung kernel
of :mod:`kernels.hostile_kernels` starts (a stand-in for a hung nvcc). After Ctrl-C (SIGINT to the
group), SIGTERM or SIGKILL to the parent alone, or a normal exit, no process carrying the marker
may remain and the script's stdout must reach EOF (a survivor would hold it open).

The temporary-file tests compile salted kernels (never in TileLang's cache, so they really compile)
with ``$TMPDIR`` pointed at a fresh directory, which must be empty afterwards; the kernel a run
returns must keep working after the run's directory is gone.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from kernels.hostile_kernels import (
    add_crashing_the_compiler,
    add_hang_with_grandchild,
    add_leaving_a_process,
    add_noting_priority,
    add_salted,
    add_with_a_lock,
)

from autotuner import procs
from autotuner.compile import compile_all, tl_compile

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; Linux only")

TESTS = Path(__file__).parent
MARKER_VAR = "TILECARVE_TEST_MARKER"

SCRIPT = textwrap.dedent('''
    import sys
    sys.path[:0] = [{tests!r}, {repo!r}]
    import torch
    from autotuner import AutoTuner
    from kernels.c_kernels import ref_add
    from kernels.hostile_kernels import add_hang_with_grandchild

    backend, n_jobs, timeout, salt = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    if backend.startswith("after-ray:"):  # this process has been a Ray driver: it may fork nothing
        from autotuner import forking
        forking._RAY_SEEN, backend = True, backend.split(":", 1)[1]
    configs = [dict(block_M=32, salt=salt), dict(block_M=64, hang=True)]  # salt: a real compile, no cache hit
    r = (AutoTuner.from_kernel(add_hang_with_grandchild, configs)
         .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c", compile_timeout=timeout)
         .set_tuning(n_jobs=n_jobs, backend=backend, progress=False).run(1, 3))
    a = torch.ones(256, 256)
    assert torch.equal(r.kernel(a, a), a * 2), "the returned kernel must still work"
    print("DONE", r.config, [t.status for t in r.trials], flush=True)
''').format(tests=str(TESTS), repo=str(TESTS.parent))


def _marked(marker: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment carries ``marker``: pid -> command line."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:  # gone, or a zombie (its environ reads empty)
            continue
    return found


def _kill_marked(marker: str) -> None:
    """SIGKILL what a test started (and only that: the processes carrying its own marker)."""
    for pid in _marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Run:
    """The tuning script, started in its own session with a unique marker; killed for good at the end."""

    def __init__(self, tmp: Path, backend: str, n_jobs: int, timeout: float) -> None:
        self.marker = uuid.uuid4().hex
        self.pids_dir = tmp / "pids"
        self.pids_dir.mkdir()
        self.tmpdir = tmp / "tmpdir"  # the run's $TMPDIR: must be left empty
        self.tmpdir.mkdir()
        (tmp / "tune.py").write_text(SCRIPT)
        env = dict(os.environ, **{MARKER_VAR: self.marker, "TILECARVE_TEST_PIDS": str(self.pids_dir),
                                  "TMPDIR": str(self.tmpdir)})
        self.err_path = tmp / "stderr"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(tmp / "tune.py"), backend, str(n_jobs), str(timeout),
                                          str(uuid.uuid4().int % 10**9)],
                                         stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.out: list[bytes] = []
        self.reader = threading.Thread(target=lambda: self.out.append(self.proc.stdout.read()), daemon=True)
        self.reader.start()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")[-3000:]

    def wait_for_hang(self, limit: float = 180) -> list[int]:
        """Pids of the hung compiler and its sleeping grandchild, once both are running."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            names = [p.name for p in self.pids_dir.iterdir() if not p.name.endswith(".tmp")]
            if any(n.startswith("sleeper-") for n in names):
                return [int(n.split("-")[1]) for n in names]
            assert self.proc.poll() is None, f"the script ended before its compile hung:\n{self.stderr()}"
            time.sleep(0.1)
        raise AssertionError(f"the compile never hung:\n{self.stderr()}")

    def assert_all_gone(self, pids: list[int], limit: float = 15) -> None:
        self.reader.join(limit)
        assert not self.reader.is_alive(), (f"stdout still open {limit} s later, held by {_marked(self.marker)}\n"
                                            f"{self.stderr()}")
        deadline = time.monotonic() + limit
        while (left := _marked(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes outlived the run: {left}\n{self.stderr()}"
        assert not [p for p in pids if _alive(p)], "the hung compiler or its grandchild is still alive"
        self.proc.wait(limit)

    def kill(self) -> None:
        """Whatever happened in the test, no process of this run survives it."""
        self.proc.kill()
        _kill_marked(self.marker)
        self.proc.wait(10)
        self.proc.stdout.close()


@pytest.fixture
def run_script(tmp_path):
    runs: list[Run] = []

    def start(backend: str, n_jobs: int, timeout: float = 600) -> Run:
        runs.append(Run(tmp_path, backend, n_jobs, timeout))
        return runs[-1]

    yield start
    for r in runs:
        r.kill()


# forked pool, loky, in the parent, and one loky worker where the parent may not fork (it ran Ray)
WORKERS = [("multiprocessing", 2), ("loky", 2), ("multiprocessing", 1), ("after-ray:multiprocessing", 1)]


@pytest.mark.parametrize("backend, n_jobs", WORKERS)
def test_ctrl_c_during_a_hung_compile_leaves_no_process(run_script, backend, n_jobs):
    run = run_script(backend, n_jobs)
    pids = run.wait_for_hang()
    os.killpg(run.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    run.assert_all_gone(pids)
    assert run.proc.returncode != 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("backend, n_jobs", WORKERS)
def test_killing_the_parent_alone_leaves_no_process(run_script, backend, n_jobs, sig):
    run = run_script(backend, n_jobs)
    pids = run.wait_for_hang()
    os.kill(run.proc.pid, sig)  # the parent only: its children must notice on their own
    run.assert_all_gone(pids)


@pytest.mark.parametrize("backend, n_jobs", WORKERS)
def test_a_normal_exit_leaves_no_process_and_no_temporary_file(run_script, backend, n_jobs):
    run = run_script(backend, n_jobs, timeout=4)  # the hung compile is killed at its timeout
    run.assert_all_gone([], limit=240)
    assert run.proc.returncode == 0, run.stderr()
    out = b"".join(run.out).decode()
    assert "DONE" in out and "'timeout'" in out, out
    assert sorted(os.listdir(run.tmpdir)) == [], "temporary files left in $TMPDIR"


def test_compiles_leave_nothing_in_a_fresh_tmpdir_and_the_run_directory_goes(tmp_path, monkeypatch):
    """Workers, compile children and their compilers write only inside the run's directory, which goes
    at the end; a kernel loaded from there keeps working after it is gone."""
    fresh = tmp_path / "tmp"
    fresh.mkdir()
    monkeypatch.setenv("TMPDIR", str(fresh))
    monkeypatch.setattr(tempfile, "tempdir", str(fresh))
    salt = uuid.uuid4().int % 10**9  # kernels TileLang's cache has not seen: they really compile
    with procs.run_scratch() as scratch:
        assert Path(scratch).parent == fresh and tempfile.gettempdir() == scratch == os.environ["TMPDIR"]
        for n_jobs in (2, 1):  # forked workers; in this process
            configs = [dict(block_M=32, salt=salt + n_jobs), dict(block_M=16, salt=salt + n_jobs)]
            outcomes = list(compile_all(add_salted, configs, [0, 1], "c", timeout=120, n_jobs=n_jobs))
            assert [o.status for o in outcomes] == ["ok", "ok"], outcomes
            assert os.listdir(scratch) == [procs._LOCK_NAME]  # each compile's files went with it
        # the worst case for a returned kernel: compiled in this process, its library in scratch
        monkeypatch.setenv("TILELANG_DISABLE_CACHE", "1")
        jit = tl_compile(add_salted(block_M=64, salt=salt), "c")
        monkeypatch.delenv("TILELANG_DISABLE_CACHE")
        assert any(name.endswith(".so") for name in os.listdir(scratch))
    assert os.listdir(fresh) == []
    assert tempfile.tempdir == str(fresh) and os.environ["TMPDIR"] == str(fresh)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    c = torch.empty(256, 256)
    jit(a, b, c)
    torch.testing.assert_close(c, a + b)


@pytest.mark.parametrize("n_jobs", [2, 1])
def test_a_process_a_compile_leaves_running_is_killed_with_it(tmp_path, n_jobs):
    configs = [dict(block_M=bm, salt=uuid.uuid4().int % 10**9, pid_dir=str(tmp_path)) for bm in (16, 32)]
    outcomes = list(compile_all(add_leaving_a_process, configs, [0, 1], "c", timeout=120, n_jobs=n_jobs))
    assert [o.status for o in outcomes] == ["ok", "ok"], outcomes
    strays = [int(p.name.split("-")[1]) for p in tmp_path.iterdir()]
    assert len(strays) == 2
    deadline = time.monotonic() + 5
    while [p for p in strays if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not [p for p in strays if _alive(p)], "a process started by a compile outlived it"
    finally:
        for pid in strays:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("n_jobs", [2, 1])
def test_a_crashing_compiler_is_a_compile_error_with_its_signal(n_jobs):
    configs = [dict(block_M=32), dict(block_M=64, crash=True)]
    outcomes = {o.index: o for o in compile_all(add_crashing_the_compiler, configs, [0, 1], "c", timeout=120,
                                                 n_jobs=n_jobs)}
    assert outcomes[0].status == "ok", outcomes[0]
    assert outcomes[1].status == "compile_error" and "SIGSEGV" in outcomes[1].error, outcomes[1]
    # where it crashed, innermost Python frame first (faulthandler's report in the compile's directory)
    assert re.search(r'; in File ".*hostile_kernels\.py", line \d+ in add_crashing_the_compiler', outcomes[1].error), \
        outcomes[1].error


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_compile_worker_killed_from_outside_costs_its_config_not_the_run(tmp_path, monkeypatch):
    """kill -9 (or the OOM killer) on a forked worker in the middle of a compile: the pool would wait for
    its task forever; instead that config is a compile_error, the others finish, and the worker's
    compile child and grandchild die with it (the child's parent-death signal)."""
    monkeypatch.setenv("TILECARVE_TEST_PIDS", str(tmp_path))  # the workers are forked after this
    configs = [dict(block_M=32, salt=uuid.uuid4().int % 10**9), dict(block_M=64, hang=True)]
    victims: list[int] = []

    def kill_the_worker() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            names = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".tmp")]
            if any(n.startswith("sleeper-") for n in names):
                victims.extend(int(n.split("-")[1]) for n in names)
                compiler = next(int(n.split("-")[1]) for n in names if n.startswith("compiler-"))
                worker = _ppid(_ppid(compiler))  # compiler <- compile child (group leader) <- worker
                victims.append(worker)
                os.kill(worker, signal.SIGKILL)
                return
            time.sleep(0.1)

    outcomes = {}

    def consume() -> None:
        for o in compile_all(add_hang_with_grandchild, configs, [0, 1], "c", timeout=600, n_jobs=2):
            outcomes[o.index] = o

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    kill_the_worker()
    consumer.join(60)
    if consumer.is_alive():  # the pool waits for the lost task: end this test's own workers and fail
        for child in multiprocessing.active_children():
            child.kill()
        pytest.fail("compile_all still waits for the task of the killed worker")
    assert outcomes[0].status == "ok", outcomes[0]
    assert outcomes[1].status == "compile_error" and "worker" in outcomes[1].error, outcomes[1]
    assert len(victims) == 3
    deadline = time.monotonic() + 10
    while [p for p in victims if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in victims if _alive(p)], "the dead worker's compile child or grandchild lives on"


@pytest.mark.parametrize("n_jobs, backend, after_ray", [(2, "loky", False), (2, "multiprocessing", False),
                                                       (1, None, True), (2, None, True)])
def test_a_killed_compile_worker_costs_its_config_on_every_backend(monkeypatch, n_jobs, backend, after_ray):
    """The worker compiling config 1 is SIGKILLed (by its own compiler, standing in for the OOM killer): that
    config is a compile_error, every other config compiles. joblib ends a loky pool when one of its workers
    dies, so the configs left are compiled again one at a time; the forked pool and the one loky worker
    (after Ray) know which config the dead worker held."""
    from kernels.c_kernels import add_killing_worker

    from autotuner import forking
    from autotuner.compile import compile_all

    monkeypatch.setattr(forking, "_RAY_SEEN", after_ray)
    configs = [dict(block_M=16), dict(block_M=32, kill_worker=True), dict(block_M=64), dict(block_M=128)]
    outcomes = {o.index: o for o in compile_all(add_killing_worker, configs, [0, 1, 2, 3], "c", timeout=120,
                                                 n_jobs=n_jobs, backend=backend)}
    assert sorted(outcomes) == [0, 1, 2, 3]
    assert outcomes[1].status == "compile_error" and "killed from outside" in outcomes[1].error, outcomes[1]
    assert all(outcomes[i].status == "ok" for i in (0, 2, 3)), outcomes


def test_an_interrupted_compile_in_the_one_loky_worker_stops_with_its_worker(tmp_path, monkeypatch):
    """A process that has run Ray compiles with one worker in loky's (joblib would compile here). Ctrl-C
    while a compile hangs, in a process that goes on (a notebook): the compile and its grandchild die
    at once, not at the compile's timeout, and the next compile does not wait behind them."""
    from joblib.externals.loky import get_reusable_executor

    from autotuner import forking

    monkeypatch.setattr(forking, "_RAY_SEEN", True)
    monkeypatch.setenv("TILECARVE_TEST_PIDS", str(tmp_path))
    get_reusable_executor(max_workers=1).shutdown(wait=True)  # the next worker starts with this environment

    def pids() -> list[int]:
        return [int(p.name.split("-")[1]) for p in tmp_path.iterdir() if not p.name.endswith(".tmp")]

    main = threading.main_thread().ident

    def interrupt_once_hung() -> None:
        deadline = time.monotonic() + 50
        while len(pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, as Python sees it: in the main thread

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_hung, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):  # the compile's own timeout bounds this test if nothing comes
            list(compile_all(add_hang_with_grandchild, [dict(block_M=64, hang=True)], [0], "c", timeout=60,
                             n_jobs=1))
    finally:
        signal.signal(signal.SIGINT, previous)
    hung = pids()
    assert len(hung) == 2, hung
    deadline = time.monotonic() + 15
    while [p for p in hung if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in hung if _alive(p)], "the hung compiler or its grandchild outlived the interrupt"
    t0 = time.monotonic()
    salt = uuid.uuid4().int % 10**9
    out = list(compile_all(add_hang_with_grandchild, [dict(block_M=32, salt=salt)], [0], "c", timeout=120, n_jobs=1))
    assert [o.status for o in out] == ["ok"], out
    assert time.monotonic() - t0 < 60


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="named semaphores live in /dev/shm")
@pytest.mark.parametrize("backend", ["loky", "multiprocessing"])
def test_compiles_leave_no_named_semaphore_behind(tmp_path, backend):
    """A lock made while compiling (tqdm makes one whenever TileLang logs) must not outlive the compile:
    in a loky worker it would be a named semaphore in /dev/shm, unlinked only by a finalizer that the
    compile process, leaving through os._exit, never runs."""
    salt = uuid.uuid4().int % 10**9
    configs = [dict(block_M=bm, salt=salt, pid_dir=str(tmp_path)) for bm in (16, 32)]
    outcomes = list(compile_all(add_with_a_lock, configs, [0, 1], "c", timeout=120, n_jobs=2, backend=backend))
    assert [o.status for o in outcomes] == ["ok", "ok"], outcomes
    lockers = [p.name.split("-")[1] for p in tmp_path.iterdir()]
    assert len(lockers) == 2
    left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"sem.loky-{pid}-") for pid in lockers)]
    assert left == []


@pytest.mark.parametrize("backend", ["loky", "multiprocessing"])
def test_compiles_run_below_the_priority_of_the_process_that_tunes(tmp_path, backend):
    """Compiles give way to the measuring processes where cores are short: each compiles at a lower
    priority (a higher nice value) than this process, its measuring processes' parent."""
    from autotuner.compile import COMPILE_NICE

    salt = uuid.uuid4().int % 10**9
    configs = [dict(block_M=bm, salt=salt, pid_dir=str(tmp_path)) for bm in (16, 32)]
    outcomes = list(compile_all(add_noting_priority, configs, [0, 1], "c", timeout=120, n_jobs=2, backend=backend))
    assert [o.status for o in outcomes] == ["ok", "ok"], outcomes
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    seen = [int(p.read_text()) for p in tmp_path.iterdir() if p.name.startswith("nice-")]
    assert seen == [min(19, mine + COMPILE_NICE)] * 2
    # where sessions are autogroups, the compile's session is one, and nice ranks only inside it: the group too
    groups = [p.read_text() for p in tmp_path.iterdir() if p.name.startswith("autogroup-")]
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if groups and enabled.exists() and enabled.read_text().strip() == "1":
        assert all(g.split()[-1] == str(COMPILE_NICE) for g in groups), groups


def test_run_scratch_is_removed_on_error_and_ctrl_c(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for exc in (RuntimeError, KeyboardInterrupt):
        with pytest.raises(exc), procs.run_scratch() as scratch:
            Path(scratch, "left.cpp").write_text("")
            raise exc()
        assert not Path(scratch).exists()
    assert tempfile.tempdir == str(tmp_path)


def test_run_scratch_turns_sigterm_into_an_exit_that_cleans_up(tmp_path):
    script = tmp_path / "term.py"
    script.write_text(textwrap.dedent(f'''
        import os, signal, sys, time
        sys.path.insert(0, {str(TESTS.parent)!r})
        from autotuner import procs
        with procs.run_scratch() as d:
            print(d, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
    '''))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert not Path(p.stdout.strip()).exists()


def test_run_scratch_sweeps_directories_of_runs_killed_outright(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f'''
        import os, signal, sys
        sys.path.insert(0, {str(TESTS.parent)!r})
        from autotuner import procs
        with procs.run_scratch() as d:
            open(os.path.join(d, "left.so"), "w").close()
            print(d, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    '''))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TMPDIR=str(tmp_path)))
    dead = Path(p.stdout.strip())
    assert p.returncode == -signal.SIGKILL and dead.is_dir()
    monkeypatch.setattr(procs, "_SWEEP_MIN_AGE_S", 0.0)
    with procs.run_scratch() as live:
        with procs.run_scratch() as inner:  # a live run's directory is never swept
            assert Path(live).is_dir() and Path(inner).is_dir()
        assert not dead.exists()
    assert os.listdir(tmp_path) == ["killed.py"]


def test_die_with_parent_kills_a_child_whose_parent_is_gone():
    """The prctl backstop: a grandchild whose parent dies gets the signal, even though the parent was
    SIGKILLed and ran no cleanup."""
    code = textwrap.dedent(f'''
        import os, subprocess, sys, time
        sys.path.insert(0, {str(TESTS.parent)!r})
        from autotuner.procs import python_child_argv
        child = subprocess.Popen(python_child_argv("import time; time.sleep(600)"))
        print(child.pid, flush=True)
        time.sleep(600)
    ''')
    marker = uuid.uuid4().hex
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, **{MARKER_VAR: marker}))
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)  # let the child arm its parent-death signal
        assert _alive(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()
        _kill_marked(marker)
        parent.wait(10)
        parent.stdout.close()



@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; Linux only")
def test_the_parent_watch_thread_leaves_every_signal_to_the_main_thread():
    """A pool worker's watcher thread blocks every signal. Pool.terminate's one SIGTERM, taken by the
    watcher as it woke from its sleep, never woke the worker's main thread, asleep on the pool's
    task-queue lock, and terminate() waited for that worker forever (seen in a job whose last
    plan failed)."""
    watcher = procs.watch_parent(os.getppid(), interval=3600.0)
    blocked = 0
    for _ in range(200):
        with open(f"/proc/self/task/{watcher.native_id}/status") as f:
            blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
        if blocked:
            break
        time.sleep(0.01)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        assert blocked >> (sig - 1) & 1, (sig, hex(blocked))
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:  # the caller's mask is untouched
        mine = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    assert not mine >> (signal.SIGTERM - 1) & 1


def _miss_the_first_sigterm_while_blocked(lock: Any) -> None:
    """A pool worker's initializer that ends up as the worker that hung a run: asleep on a lock nobody
    releases (the task-queue lock of a sibling killed while holding it), and its first SIGTERM lost
    (one that lands just before it blocks); the next one kills it."""
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    lock.acquire()


def test_terminating_a_pool_ends_even_when_a_worker_misses_its_sigterm():
    """Pool.terminate sends one SIGTERM per worker and waits for each; a worker that missed it kept
    the run waiting forever (a failing reference, about once in a hundred runs). terminate_pool
    signals the workers still alive again."""
    from autotuner.compile import terminate_pool

    ctx = multiprocessing.get_context("fork")
    lock = ctx.Lock()
    lock.acquire()
    others = {p.pid for p in multiprocessing.active_children()}
    pool = ctx.Pool(1, initializer=_miss_the_first_sigterm_while_blocked, initargs=(lock,))
    workers = lambda: {p.pid for p in multiprocessing.active_children()} - others  # noqa: E731
    time.sleep(0.5)  # the worker is asleep on the lock
    assert len(workers()) == 1
    t0 = time.monotonic()
    stopper = threading.Thread(target=terminate_pool, args=(pool, workers), daemon=True)
    stopper.start()
    stopper.join(20)
    assert not stopper.is_alive(), "terminate_pool still waits for a worker that missed its SIGTERM"
    assert time.monotonic() - t0 < 10 and not workers()
    pool.join()


# --- end to end: the measuring process and the parent's own compiles ----------------------------

SPIN_SCRIPT = textwrap.dedent('''
    import os, sys
    sys.path[:0] = [{tests!r}, {repo!r}]
    from autotuner import AutoTuner
    from kernels.c_kernels import add_crashing

    def ref(A, B):  # runs in the measuring process just before the candidate does
        open(os.path.join(os.environ["TILECARVE_TEST_PIDS"], f"ref-{{os.getpid()}}"), "w").close()
        return A + B

    (AutoTuner.from_kernel(add_crashing, [dict(mode="spin")])
     .set_compile_args(out_idx=[-1], ref_prog=ref, target="c")
     .set_tuning(n_jobs=1, progress=False, run_timeout=600).run(1, 3))
''').format(tests=str(TESTS), repo=str(TESTS.parent))


def test_a_measuring_process_stuck_in_a_kernel_dies_with_a_killed_parent(tmp_path):
    marker = uuid.uuid4().hex
    script = tmp_path / "spin.py"
    script.write_text(SPIN_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, **{MARKER_VAR: marker, "TILECARVE_TEST_PIDS": str(tmp_path)}))
    try:
        deadline = time.monotonic() + 180
        while not (refs := list(tmp_path.glob("ref-*"))) and time.monotonic() < deadline:
            assert proc.poll() is None, "the script ended before its kernel ran"
            time.sleep(0.1)
        assert refs, "the measuring process never got to the endless kernel"
        spinning = int(refs[0].name.split("-")[1])
        time.sleep(2.0)  # the reference is timed, then the endless candidate runs
        proc.kill()  # SIGKILL: the parent closes nothing and tells nobody
        proc.wait(10)
        deadline = time.monotonic() + 15
        while _alive(spinning) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(spinning), "the measuring process outlived its parent"
    finally:
        proc.kill()
        _kill_marked(marker)
        proc.wait(10)


def test_a_tuning_run_that_compiles_in_the_parent_leaves_no_temporary_file(tmp_path):
    """With TileLang's kernel cache off, the measuring process and the parent compile too (their
    ``.cpp``/``.so`` pairs land in ``$TMPDIR``); the run's directory must take them all, and the kernel
    it returns must work after that directory is gone."""
    fresh = tmp_path / "tmp"
    fresh.mkdir()
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TMPDIR=str(fresh), TILELANG_DISABLE_CACHE="1", TILECARVE_TEST_PIDS=str(tmp_path))
    p = subprocess.run([sys.executable, str(script), "multiprocessing", "2", "4", str(uuid.uuid4().int % 10**9)],
                       capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and "DONE" in p.stdout, p.stderr[-3000:]
    assert os.listdir(fresh) == []


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_measuring_process_that_dies_as_it_starts_is_an_error_not_a_loop(monkeypatch, start):
    """A fresh measuring process that exits before reading its job (a broken environment) used to be
    respawned forever when the job was larger than the pipe holds (found in review, 2026-11-22). Forked or
    spawned alike."""
    import autotuner.bench as bench_mod
    from autotuner import forking

    spawned = []

    def argv(code):
        spawned.append(code)
        if len(spawned) > 5:
            pytest.fail("respawned a measuring process that cannot start")
        return [sys.executable, "-c", "import sys; sys.exit(1)"]

    def fork_child(main, env, name=None):
        spawned.append(name)
        if len(spawned) > 5:
            pytest.fail("forked again a measuring process that cannot start")
        return real_fork(main, env, name)

    class Spec:
        device = "cpu"

    real_fork = forking.fork_child
    monkeypatch.setenv(forking.START_ENV, start)
    monkeypatch.setattr(bench_mod.procs, "python_child_argv", argv)
    monkeypatch.setattr(forking, "fork_child", fork_child)
    monkeypatch.setattr(bench_mod, "_serve", lambda fd, device: os._exit(1))  # what a forked one runs
    monkeypatch.setattr(bench_mod, "spec_payload", lambda specs: (b"x" * 5_000_000, [], {}))
    with pytest.raises(RuntimeError, match=r"the measuring process exited as it started \(exit code 1\)"):
        bench_mod.IsolatedBench([Spec()], 10.0)
    assert len(spawned) == 1


def test_a_measuring_process_that_crashes_prints_where_on_stderr(capfd):
    """A kernel that kills its measuring process (SIGSEGV raised by the kernel itself) costs its trial, and
    the process's Python stack goes to stderr (faulthandler), so that a crash nobody planned says where."""
    from kernels.c_kernels import add_crashing, ref_add

    from autotuner import AutoTuner

    result = (AutoTuner.from_kernel(add_crashing, [dict(mode="abort"), dict(block_M=16)])
              .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
              .set_tuning(n_jobs=2, progress=False, cache=False).run(1, 3))
    assert [str(t.status) for t in result.trials] == ["runtime_error", "ok"], result.trials
    err = capfd.readouterr().err
    assert "Fatal Python error: Segmentation fault" in err and "in measure" in err, err[-3000:]
