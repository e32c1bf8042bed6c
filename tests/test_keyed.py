"""Keyed, bucketed tuning, tuned tables and recording (autotuner/keyed.py, table.py, record.py, buckets.py)
end to end on TileLang's C target. One module fixture records and tunes two buckets (4 compiles);
the other tests reuse its database and table, and TileLang's disk cache."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from kernels import trust_helper
from kernels.keyed_kernels import CONFIGS, make_keyed, scale_add, scale_add_helper, scale_add_skipping

import autotuner
from autotuner import Buckets, KeyedKernel, TableError, TuningError, load_table, record, use_table, write_table
from autotuner.buckets import as_buckets

TESTS = Path(__file__).parent
ROOT = TESTS.parent
NAME = "kernels.keyed_kernels.scale_add"


def args(m: int, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(m, n), torch.randn(m, n)


def key(m: int, n: int = 64) -> dict:
    return {"M": m, "N": n, "dtype": "float32"}


@pytest.fixture(autouse=True)
def _no_global_table():
    yield
    use_table(None)
    import gc

    gc.collect()  # this test's keyed kernels leave the registry, so a later global table is not checked by them


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Record three calls (M=3 and 5 fall in bucket 8, M=40 in bucket 64), tune both buckets, write a table."""
    os.environ.setdefault("TILELANG_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tilelang-cache"))
    d = tmp_path_factory.mktemp("keyed")
    kk = make_keyed(d / "tuning.sqlite")
    with record() as rec:
        for m in (3, 5, 40):
            a, b = args(m)
            torch.testing.assert_close(kk(a, b), a * 2 + b)  # served by the fallback before tuning
    path = rec.tune(d / "table.json")
    return SimpleNamespace(dir=d, kk=kk, rec=rec, path=path, db=d / "tuning.sqlite")


# ------------------------------------------------------------------------------------ buckets, keys
def test_bucket_edges_and_representatives():
    b = Buckets((1, 16, 128))
    assert [b.bucket(v) for v in (1, 2, 16, 17, 128, 129, 10**6)] == [1, 16, 16, 128, 128, 128, 128]
    p = Buckets.pow2(max=8192)
    assert p.edges[:4] == (1, 2, 4, 8) and p.edges[-1] == 8192 and len(p.edges) == 14
    assert (p.bucket(100), p.bucket(128), p.bucket(129), p.bucket(8193)) == (128, 128, 256, 8192)
    assert Buckets.pow2(max=100).edges[-2:] == (64, 100)
    assert as_buckets("M", "pow2") == as_buckets("M", True) == Buckets.pow2()
    assert as_buckets("M", [4, 8]) == Buckets((4, 8))
    with pytest.raises(ValueError, match="strictly increasing, got 4 then 2"):
        Buckets((4, 2))
    with pytest.raises(ValueError, match="empty"):
        Buckets(())
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            b.bucket(bad)
    with pytest.raises(TypeError, match=r"buckets\['M'\].*pow2"):
        as_buckets("M", "cubes")


def test_the_bucket_is_tuned_at_its_edge():
    kk = make_keyed()
    assert kk.make_key(key(5)) == key(8) and kk.make_key(key(9)) == key(64) and kk.make_key(key(500)) == key(64)
    assert kk.tuner(key(5)).fn.keywords == key(8)  # the tuner elaborates the kernel at M = 8
    assert kk.make_key({"M": 3, "N": 64, "dtype": torch.float32}) == key(8)  # torch dtypes become names


def test_keys_are_checked_up_front():
    with pytest.raises(ValueError, match=r"key 'K' is not a parameter of .*scale_add; its parameters are "
                                         r"\['M', 'N', 'block_M', 'block_N', 'dtype'\]"):
        KeyedKernel(scale_add, ["M", "K"], CONFIGS)
    with pytest.raises(ValueError, match="buckets names 'N', which is not in the key"):
        KeyedKernel(scale_add, ["M"], CONFIGS, buckets={"N": "pow2"})
    with pytest.raises(ValueError, match="dynamic key 'N' must be bucketed"):
        KeyedKernel(scale_add, ["M", "N"], CONFIGS, dynamic=["N"])
    with pytest.raises(ValueError, match=r"sets key parameter\(s\) \['M'\]"):
        KeyedKernel(scale_add, ["M"], [{"M": 4, "block_M": 16}])
    with pytest.raises(ValueError, match="atol must be >= 0"):
        KeyedKernel(scale_add, ["M"], CONFIGS, compile_args={"atol": -1.0})
    kk = make_keyed()
    with pytest.raises(ValueError, match=r"exactly the names \['M', 'N', 'dtype'\], got \['M'\]"):
        kk.make_key({"M": 3})
    with pytest.raises(ValueError, match="positive int, got 0"):
        kk.make_key(key(0))


# ------------------------------------------------------------------------------------ serving
def test_fallback_is_logged_once_per_key_counted_and_never_timed(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(autotuner.AutoTuner, "plan", lambda *a, **k: pytest.fail("something was tuned"))
    kk = make_keyed(tmp_path / "db.sqlite")
    with caplog.at_level(logging.INFO, logger="autotuner.keyed"):
        for m in (3, 5, 40, 7, 3, 3):  # a repeated shape takes the fast path and is still counted
            a, b = args(m)
            torch.testing.assert_close(kk(a, b), a * 2 + b)
    logged = [r.getMessage() for r in caplog.records if "no tuned config" in r.getMessage()]
    assert len(logged) == 2 and "{'M': 8, 'N': 64, 'dtype': 'float32'}" in logged[0], logged
    assert kk.stats["fallback"] == 2 and kk.stats["compiles"] == 2  # dynamic M: one kernel per bucket
    assert sorted(kk.untuned(), key=lambda x: x[0]["M"]) == [(key(8), 5), (key(64), 1)]
    assert (NAME, key(8), 5) in autotuner.untuned()
    assert kk.config_for(key(3)) == (CONFIGS[0], "fallback")
    assert not (tmp_path / "db.sqlite").exists()  # nothing tuned, nothing stored: serving creates no database


def test_a_key_that_is_not_dynamic_is_compiled_per_exact_value(tmp_path):
    kk = make_keyed(tmp_path / "db.sqlite", dynamic=[])
    for m in (3, 5, 3):
        a, b = args(m)
        torch.testing.assert_close(kk(a, b), a * 2 + b)
    assert kk.stats["compiles"] == 2 and kk.stats["fallback"] == 1
    assert [int(x) for x in kk.kernel_for(key(5)).params[0].shape] == [5, 64]


def test_record_collects_each_bucket_key_once(tuned):
    assert tuned.rec.keys == [(NAME, key(8)), (NAME, key(64))]
    assert tuned.kk.stats["tuned"] == 2 and tuned.kk.untuned() == []
    assert tuned.kk.config_for(key(5))[1] == "tuned"


def test_a_failed_tune_leaves_no_results_of_an_earlier_one(tuned, monkeypatch):
    rec_mod = sys.modules["autotuner.record"]
    rec = rec_mod.Recording()
    rec.seen, rec.results = dict(tuned.rec.seen), ["a result of an earlier tune"]

    def fail(*args, **kwargs):
        raise TuningError("every key failed")

    monkeypatch.setattr(rec_mod, "tune_keys", fail)
    with pytest.raises(TuningError, match="every key failed"):
        rec.tune()
    assert rec.results == []


def test_the_database_serves_a_tuned_key_without_tuning(tuned, monkeypatch):
    monkeypatch.setattr(autotuner.AutoTuner, "plan", lambda *a, **k: pytest.fail("something was tuned"))
    fresh = make_keyed(tuned.db)
    assert fresh.config_for(key(3)) == (tuned.kk.config_for(key(3))[0], "database")
    assert fresh.stats["database"] == 1 and fresh.stats["compiles"] == 0


def test_a_database_winner_whose_code_changed_since_is_not_served(tmp_path, monkeypatch, caplog):
    """As on AutoTuner's warm path: the stored winner must elaborate to the PrimFunc that was tuned. A helper
    edited since (outside the key) makes it wrong, and the keyed kernel falls back instead of serving it."""
    kk = make_keyed(tmp_path / "tuning.sqlite", fn=scale_add_helper)
    winner = kk.tune(key(40)).config
    assert make_keyed(tmp_path / "tuning.sqlite", fn=scale_add_helper).config_for(key(40)) == (winner, "database")
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 1.0 if block_M == winner["block_M"] else 0.0)
    fresh = make_keyed(tmp_path / "tuning.sqlite", fn=scale_add_helper)
    with caplog.at_level(logging.WARNING, logger="autotuner.keyed"):
        assert fresh.config_for(key(40))[1] == "fallback"
    assert "elaborates to a different PrimFunc" in caplog.text and fresh.stats["database"] == 0
    if fresh.config_for(key(40))[0] != winner:  # the fallback (the first candidate) is right unless it won
        a, b = args(40)
        torch.testing.assert_close(fresh(a, b), a * 2 + b)


# ------------------------------------------------------------------------------------ tables
def test_table_round_trip(tuned, tmp_path):
    t = load_table(tuned.path, target="c")
    assert (t.gpu, t.tilelang) == ("cpu", __import__("tilelang").__version__)
    s = t.kernels[NAME]
    assert s.key == ("M", "N", "dtype") and s.buckets == {"M": (8, 64)}
    assert [e.key for e in s.entries] == [key(8), key(64)]
    for e in s.entries:
        assert e.config == tuned.kk.config_for(e.key)[0] and e.latency_ms > 0
    text = tuned.path.read_text()
    rows = [json.loads(line.strip().rstrip(",")) for line in text.splitlines() if '"latency_ms"' in line]
    assert len(rows) == 2  # one entry per line
    again = write_table(tmp_path / "again.json", t.kernels.values(), tuned.kk.target())
    assert load_table(again, target="c").kernels[NAME].entries == s.entries


def _mutated(tuned, tmp_path, change) -> Path:
    doc = json.loads(tuned.path.read_text())
    change(doc)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    return p


def _section(doc):
    return doc["kernels"][NAME]


REFUSED_AT_LOAD = [
    (lambda d: d.update(gpu="NVIDIA H100"), "field 'gpu' is 'NVIDIA H100' but here it is 'cpu'"),
    (lambda d: d.update(tilelang="0.0.1"), "field 'tilelang' is '0.0.1' but here it is"),
    (lambda d: d.update(target="cuda -arch=sm_90a"), "field 'target' is 'cuda -arch=sm_90a'"),
    (lambda d: d.update(format="other/2"), "field 'format' is 'other/2'"),
    (lambda d: d.pop("kernels"), "field 'kernels' is missing"),
    (lambda d: _section(d)["entries"][0].update(latency_ms=-1), r"entries\[0\].latency_ms is -1"),
    (lambda d: _section(d)["entries"][0]["key"].update(M=9), r"key.M is 9, which is not one of its bucket edges"),
    (lambda d: _section(d)["entries"][0]["key"].update(M=8.0), r"key.M is 8.0, which is not one of its bucket edges"),
    (lambda d: _section(d)["entries"][0]["key"].update(M=True), r"key.M is True, which is not one of its bucket"),
    (lambda d: _section(d)["entries"][0]["key"].pop("N"), r"entries\[0\].key has names \['M', 'dtype'\]"),
    (lambda d: _section(d)["entries"].append(_section(d)["entries"][0]), r"entries\[2\] repeats the key"),
    (lambda d: _section(d)["entries"][1].update(config=[1]), r"entries\[1\]: field 'config' is \[1\]"),
]


@pytest.mark.parametrize("change,message", REFUSED_AT_LOAD)
def test_a_bad_table_is_refused_naming_file_field_and_mismatch(tuned, tmp_path, change, message):
    bad = _mutated(tuned, tmp_path, change)
    with pytest.raises(TableError, match=message) as e:
        load_table(bad, target="c")
    assert str(bad) in str(e.value)


def test_malformed_json_and_allowed_mismatches(tuned, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(tuned.path.read_text()[:-20])
    with pytest.raises(TableError, match=f"{broken}: not JSON"):
        load_table(broken, target="c")
    other_gpu = _mutated(tuned, tmp_path, lambda d: d.update(gpu="NVIDIA H100"))
    assert load_table(other_gpu, target="c", allow=["gpu"]).gpu == "NVIDIA H100"
    with pytest.raises(ValueError, match="allow names"):
        load_table(other_gpu, target="c", allow=["colour"])


def test_a_table_for_another_key_buckets_or_source_is_refused_when_used(tuned, tmp_path):
    def other_key(d):
        s = _section(d)
        s["key"] = ["M", "N"]
        for e in s["entries"]:
            e["key"].pop("dtype")
    for change, msg in ((other_key, r"kernels.kernels.keyed_kernels.scale_add.key is \['M', 'N'\] but the "
                                    r"kernel's key is \['M', 'N', 'dtype'\]"),
                        (lambda d: _section(d).update(buckets={"M": [8, 64, 512]}),
                         r"buckets is \{'M': \[8, 64, 512\]"),
                        (lambda d: _section(d).update(source="0" * 64), "source is 0000000000000000 but")):
        bad = _mutated(tuned, tmp_path, change)
        with pytest.raises(TableError, match=msg) as e:
            make_keyed().use_table(load_table(bad, target="c"))
        assert str(bad) in str(e.value)
    kk = make_keyed()
    kk.use_table(load_table(bad, target="c", allow=["source"]))  # the last one: another source, allowed
    assert kk.config_for(key(3))[1] == "table"


@pytest.mark.parametrize("how", ["kernel", "global"])
def test_a_refused_table_changes_nothing(tuned, tmp_path, how):
    """It is checked against every kernel it would serve before it is installed: the kernel goes on serving
    what it served, and a per-kernel table is removed with use_table(None)."""
    bad = load_table(_mutated(tuned, tmp_path, lambda d: _section(d).update(buckets={"M": [8, 64, 512]})),
                     target="c")
    kk = make_keyed()
    before = kk.config_for(key(3))
    with pytest.raises(TableError, match="buckets"):
        kk.use_table(bad) if how == "kernel" else autotuner.use_table(bad)
    assert kk.config_for(key(3)) == before and autotuner.keyed._TABLE[0] is None and kk.table is None
    kk.use_table(load_table(tuned.path, target="c"))
    assert kk.config_for(key(3))[1] == "table"
    assert kk.use_table(None) is None and kk.table is None and kk.config_for(key(3))[1] != "table"


@pytest.mark.parametrize("how", ["kernel", "global"])
def test_a_table_for_another_target_is_refused_by_a_kernel_that_compiles_for_it(tuned, how):
    """The table was written for the C target; a kernel compiling for sm_90a refuses it, whichever target the
    table was loaded against, unless allowed."""
    kk = make_keyed(target={"kind": "cuda", "arch": "sm_90a"})
    table = load_table(tuned.path, target="c")
    with pytest.raises(TableError, match="field 'target' is .*kind.*c.* but here it is .*sm_90a"):
        kk.use_table(table) if how == "kernel" else autotuner.use_table(table)
    assert kk.table is None and autotuner.keyed._TABLE[0] is None
    kk.use_table(load_table(tuned.path, target="c", allow=["target", "gpu"]))
    assert kk.config_for(key(3))[1] == "table"


def test_a_table_switched_during_a_first_call_is_served_from_the_next_call(tmp_path):
    """use_table in another thread between a first call's choice (no lock held) and its compile: that call may
    get the old table's kernel, but its fast path must not keep it for later calls."""
    import threading

    from autotuner.table import Entry, KernelSection, write_table
    from autotuner.target import resolve_target

    kk = make_keyed()

    def table(cfg, name):
        sec = KernelSection(kk.name, kk.source(), kk.key, {"M": (8, 64)},
                            (Entry({"M": 8, "N": 64, "dtype": "float32"}, cfg, 0.1),))
        return write_table(tmp_path / name, [sec], resolve_target("c"))

    t1, t2 = table(CONFIGS[0], "t1.json"), table(CONFIGS[1], "t2.json")
    autotuner.use_table(t1, target="c")

    class SwitchOnFirstLookup(dict):
        armed = True

        def get(self, k, default=None):
            if SwitchOnFirstLookup.armed:
                SwitchOnFirstLookup.armed = False
                th = threading.Thread(target=autotuner.use_table, args=(t2,), kwargs={"target": "c"})
                th.start()
                th.join()
            return super().get(k, default)

    kk._compiled = SwitchOnFirstLookup()
    kk.kernel_for(key(5))
    assert kk.config_for(key(5)) == (CONFIGS[1], "table")
    served = kk.kernel_for(key(5))
    assert {id(k): c for c, k in kk._compiled.values()}[id(served)] == CONFIGS[1]


def test_a_key_beyond_the_last_edge_is_checked_at_its_own_values():
    """The bucket's config was checked at the last edge (64); M=100 is checked at 100 (validate refuses it
    past 80, as a launch grid over CUDA's limit would be), M=70 passes, M=40 is within the buckets."""
    seen = []

    def validate(k, cfg):
        seen.append(k["M"])
        return ["too many rows of CTAs"] if k["M"] > 80 else []

    kk = make_keyed(validate=validate)
    with pytest.raises(autotuner.KeyRefused, match=r"cannot run at .*'M': 100.*too many rows of CTAs"):
        kk.kernel_for(key(100))
    a, b = args(70)
    torch.testing.assert_close(kk(a, b), a * 2 + b)
    a, b = args(40)
    torch.testing.assert_close(kk(a, b), a * 2 + b)
    assert seen == [100, 70]


def test_a_loaded_table_is_authoritative_and_deterministic(tuned, tmp_path):
    """Two loaders (two ranks) given the same table pick the same configs and build the same kernels; a
    key the table lacks uses the fallback, not the database."""
    table = load_table(tuned.path, target="c")
    ranks = [make_keyed(tuned.db), make_keyed(tmp_path / "other.sqlite")]
    for kk in ranks:
        kk.use_table(table)
    for m in (3, 40):
        configs = {json.dumps(kk.config_for(key(m)), sort_keys=True) for kk in ranks}
        assert len(configs) == 1 and "table" in configs.pop()
        sources = {kk.kernel_for(key(m)).get_kernel_source() for kk in ranks}
        assert len(sources) == 1
    assert ranks[0].config_for(key(3, 32)) == (CONFIGS[0], "fallback")  # not in the table: no database lookup
    first = ranks[0].kernel_for(key(3))
    assert ranks[0].kernel_for(key(3)) is first  # the fast path
    with record() as rec:
        assert ranks[0].kernel_for(key(3)) is first
    assert rec.keys == [(NAME, key(8))]  # a recording still sees calls the fast path would serve


def test_a_fresh_process_serves_the_table_without_timing(tuned, tmp_path):
    cache = tmp_path / "fresh-cache"
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        import torch, autotuner
        autotuner.AutoTuner.plan = lambda *a, **k: sys.exit("tuned in a fresh process")
        from kernels.keyed_kernels import make_keyed, key_of
        kk = make_keyed()
        autotuner.use_table({str(tuned.path)!r}, target="c")
        out = {{}}
        for m, n in ((5, 64), (33, 64), (40, 64), (3, 32)):
            a, b = torch.randn(m, n), torch.randn(m, n)
            assert torch.allclose(kk(a, b), a * 2 + b)
            out[f"{{m}}x{{n}}"] = kk.config_for(key_of(a, b))
        print(json.dumps({{"configs": out, "stats": dict(kk.stats), "untuned": autotuner.untuned()}}))
    """)
    env = {**os.environ, "TILECARVE_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    table = {tuple(e.key.values()): e.config for e in load_table(tuned.path, target="c").kernels[NAME].entries}
    assert got["configs"]["5x64"] == [table[(8, 64, "float32")], "table"]
    assert got["configs"]["33x64"] == got["configs"]["40x64"] == [table[(64, 64, "float32")], "table"]
    assert got["configs"]["3x32"] == [CONFIGS[0], "fallback"]
    assert got["stats"]["table"] == 2 and got["stats"]["fallback"] == 1 and "tuned" not in got["stats"]
    assert got["untuned"] == [[NAME, key(8, 32), 1]]
    assert not (cache / "tuning.sqlite").exists()  # the database was never opened, let alone written


SERVE_IN_ORDER = """
import json, sys
sys.path.insert(0, {tests!r})
import importlib, torch
kernel_mod = importlib.import_module("tilelang.jit.kernel")
compiled = []
real = kernel_mod.JITKernel._compile_and_create_adapter
kernel_mod.JITKernel._compile_and_create_adapter = lambda self, *a, **k: compiled.append(1) or real(self, *a, **k)
from kernels.keyed_kernels import make_keyed
kk = make_keyed()
for m, n in {shapes!r}:
    a, b = torch.randn(m, n), torch.randn(m, n)
    assert torch.allclose(kk(a, b), a * 2 + b)
print(json.dumps({{"compiled": len(compiled), "out_idx": kk.compile_args["out_idx"]}}))
"""


def test_a_fresh_process_finds_every_served_kernel_in_tilelangs_cache_whatever_the_order(tmp_path):
    """TileLang keys its disk cache on out_idx as given and rewrites a given [-1] to [2] in place: the
    keyed kernel's own list, passed to every compile, made the first kernel of a process keyed (-1,) and
    the rest (2,), so a process meeting the shapes in another order compiled them again."""
    env = {**os.environ, "TILELANG_CACHE_DIR": str(tmp_path / "tl"), "TILECARVE_CACHE_DIR": str(tmp_path / "tc")}

    def serve(shapes):
        p = subprocess.run([sys.executable, "-c", SERVE_IN_ORDER.format(tests=str(TESTS), shapes=shapes)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    first = serve([(5, 64), (40, 32)])
    assert first == {"compiled": 2, "out_idx": [-1]}  # the caller's list is left as given
    assert serve([(40, 32), (5, 64)]) == {"compiled": 0, "out_idx": [-1]}  # both from the disk cache


# ------------------------------------------------------------------------------------ tuning policy
def test_no_tuning_inside_cuda_graph_capture(tmp_path, monkeypatch):
    assert autotuner.keyed.capturing() is False  # no GPU here
    monkeypatch.setattr(autotuner.keyed, "capturing", lambda: True)
    monkeypatch.setattr(autotuner.AutoTuner, "plan", lambda *a, **k: pytest.fail("tuned during capture"))
    kk = make_keyed(tmp_path / "db.sqlite", tune_on_miss=True)
    with pytest.raises(TuningError, match="CUDA graph is being captured"):
        kk.tune(key(3))
    assert kk.config_for(key(3)) == (CONFIGS[0], "fallback")
    with record() as rec:  # recorded, though not served: it cannot be checked during the capture
        with pytest.raises(autotuner.KeyRefused, match="not checked against the reference yet"):
            kk.kernel_for(key(3))
    assert len(rec.keys) == 1
    with pytest.raises(TuningError, match="CUDA graph"):
        rec.tune(tmp_path / "t.json")


def test_a_key_compiled_during_a_capture_then_tuned_is_checked_and_served_outside_it(tmp_path, monkeypatch):
    kk = make_keyed(tmp_path / "db.sqlite")
    monkeypatch.setattr(autotuner.keyed, "capturing", lambda: True)
    with pytest.raises(autotuner.KeyRefused, match="not checked against the reference yet"):
        kk.kernel_for(key(3))
    monkeypatch.setattr(autotuner.keyed, "capturing", lambda: False)
    kk.tune(key(3))  # another choice for the key: compiled again and checked at the next call
    a = torch.ones(3, 64)
    torch.testing.assert_close(kk.kernel_for(key(3))(a, a), 3 * a)  # served, not refused as if capturing
    assert kk.stats["served checks"] == 1


def test_tune_on_miss_tunes_once_and_stores_the_winner(tmp_path):
    kk = make_keyed(tmp_path / "db.sqlite", tune_on_miss=True, configs=CONFIGS[:1])
    assert kk.config_for(key(3)) == (CONFIGS[0], "tuned")
    assert kk.config_for(key(5)) == (CONFIGS[0], "tuned") and kk.stats["tuned"] == 1
    assert make_keyed(tmp_path / "db.sqlite", configs=CONFIGS[:1]).config_for(key(7))[1] == "database"


@pytest.mark.nvcc
def test_a_dynamic_key_compiles_one_cuda_kernel_per_bucket():
    kk = make_keyed(target={"kind": "cuda", "arch": "sm_90a"})
    k = kk.kernel_for(key(5))
    assert kk.kernel_for(key(3)) is k and kk.stats["compiles"] == 1
    assert "int M" in k.get_kernel_source()  # M is a runtime argument of the CUDA kernel


# ------------------------------------------------------------------------------------ refine
def _refine_small_m(calls):
    """Serve M below 30 of bucket 64 with 64-row blocks (one block), as the matmul op steps off a wave cliff."""

    def refine(exact, bucket, config):
        calls.append(exact["M"])
        return {"block_M": 64, "block_N": 64} if bucket["M"] == 64 and exact["M"] < 30 else None

    return refine


def test_refine_serves_another_config_inside_a_bucket_compiled_once_per_config(tmp_path, caplog):
    calls = []
    kk = make_keyed(tmp_path / "db.sqlite", refine=_refine_small_m(calls))
    with caplog.at_level(logging.INFO, logger="autotuner.keyed"):
        for m in (40, 20, 25, 64, 20, 40):
            a, b = args(m)
            torch.testing.assert_close(kk(a, b), a * 2 + b)
    # the bucket's own kernel (M = 40 and 64) and the refined one (M = 20 and 25): dynamic M, one each
    assert kk.stats["compiles"] == 2 and kk.stats["refined"] == 2 and kk.stats["served checks"] == 2
    assert kk.kernel_for(key(20)) is kk.kernel_for(key(25)) is not kk.kernel_for(key(40))
    assert kk.kernel_for(key(40)) is kk.kernel_for(key(64))
    assert sorted(calls) == [20, 25, 40]  # once per exact key, never at the edge itself
    said = [r.getMessage() for r in caplog.records if "refined from" in r.getMessage()]
    assert len(said) == 1 and "M=64" in said[0] and "M=16" in said[0], said  # once per (bucket, config)
    assert kk.config_for(key(20)) == (CONFIGS[0], "fallback")  # the bucket's choice is unchanged
    kk._forget()  # a new choice (a table, a tune): every refinement is decided again
    kk.kernel_for(key(20))
    assert sorted(calls) == [20, 20, 25, 40]


@pytest.mark.parametrize("how", ["raises", "refused", "unknown key"])
def test_a_refine_that_fails_serves_the_buckets_config(tmp_path, caplog, how):
    def refine(exact, bucket, config):
        if how == "raises":
            raise RuntimeError("no model for this GPU")
        return {"block_M": 48, "block_N": 64} if how == "refused" else {"block_M": 64, "tile": 3}

    validate = (lambda k, c: ["block_M 48 is not a power of two"] if c.get("block_M") == 48 else [])
    kk = make_keyed(tmp_path / "db.sqlite", refine=refine, validate=validate)
    with caplog.at_level(logging.WARNING, logger="autotuner.keyed"):
        a, b = args(20)
        torch.testing.assert_close(kk(a, b), a * 2 + b)
    assert kk.stats["refined"] == 0 and kk.stats["compiles"] == 1
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert {"raises": "raised RuntimeError: no model for this GPU", "refused": "block_M 48 is not a power of two",
            "unknown key": "tile"}[how] in warned, warned
    with pytest.raises(TypeError, match="refine must be a callable"):
        make_keyed(refine={"block_M": 64})


def test_served_config_and_precompile_see_the_refinement(tmp_path):
    calls = []
    kk = make_keyed(tmp_path / "db.sqlite", refine=_refine_small_m(calls))
    assert kk.served_config(key(40)) == (CONFIGS[0], "fallback")
    cfg, source = kk.served_config(key(20))
    assert cfg == {"block_M": 64, "block_N": 64} and "refined" in source and "fallback" in source
    # three keys, two kernels (bucket 64's own and its refined one), compiled together; their first calls
    # compile nothing more, and each is still checked against the reference before it is served
    assert kk.precompile([key(40), key(20), key(25)], jobs=2) == 2 and kk.stats["compiles"] == 2
    assert kk.precompile([key(40), key(20)]) == 0
    for m in (40, 20, 25):
        a, b = args(m)
        torch.testing.assert_close(kk(a, b), a * 2 + b)
    assert kk.stats["compiles"] == 2 and kk.stats["served checks"] == 2


@pytest.mark.parametrize("how", ["does not compile", "is wrong", "sets a key parameter"])
def test_a_refined_config_that_fails_leaves_its_keys_to_the_buckets_config(tmp_path, caplog, how):
    bad = {"does not compile": {"block_M": 64, "block_N": "x"}, "is wrong": {"block_M": 64, "block_N": 64, "skip": 1},
           "sets a key parameter": {"M": 64, "block_M": 64, "block_N": 64}}[how]
    kk = make_keyed(tmp_path / "db.sqlite", fn=scale_add_skipping, refine=lambda e, b, c: bad if e["M"] < 30 else None)
    with caplog.at_level(logging.WARNING, logger="autotuner.keyed"):
        for m in (20, 25, 20):  # both refined to the failing config; the bucket's kernel serves them
            a, b = args(m)
            torch.testing.assert_close(kk(a, b), a * 2 + b)
    assert kk.kernel_for(key(20)) is kk.kernel_for(key(40))
    tried = {"does not compile": 2, "is wrong": 2, "sets a key parameter": 1}[how]
    assert kk.stats["compiles"] == tried  # the failing one once, then never again
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert {"does not compile": "failed (InternalError", "is wrong": "does not match the reference",
            "sets a key parameter": "sets key parameter(s) ['M']"}[how] in warned, warned


def test_precompile_and_served_config_never_tune_and_one_bad_kernel_spares_the_rest(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(autotuner.AutoTuner, "plan", lambda *a, **k: pytest.fail("something was tuned"))
    kk = make_keyed(tmp_path / "db.sqlite", tune_on_miss=True,
                    refine=lambda e, b, c: {"block_M": 64, "block_N": "x"} if e["M"] == 20 else None)
    assert kk.served_config(key(40)) == (CONFIGS[0], "fallback")
    with caplog.at_level(logging.WARNING, logger="autotuner.keyed"):
        assert kk.precompile([key(40), key(20), key(3)], jobs=2) == 2  # buckets 64 and 8; the refined one fails
    assert "precompile: the config M=64 N=x" in caplog.text and kk.stats["compiles"] == 3
    assert not kk._chosen  # nothing was chosen for good: the first call still tunes (tune_on_miss)


def test_during_a_capture_an_unchecked_refined_kernel_gives_way_to_the_buckets_checked_one(tmp_path, monkeypatch):
    calls = []
    kk = make_keyed(tmp_path / "db.sqlite", refine=_refine_small_m(calls))
    a, b = args(40)
    own = kk.kernel_for(key(40))  # the warm-up: bucket 64's own kernel, checked
    monkeypatch.setattr(autotuner.keyed, "capturing", lambda: True)
    assert kk.kernel_for(key(20)) is own and kk.stats["compiles"] == 1  # nothing compiled or served unchecked
    monkeypatch.setattr(autotuner.keyed, "capturing", lambda: False)
    a, b = args(20)
    torch.testing.assert_close(kk(a, b), a * 2 + b)  # outside the capture: the refined kernel, checked first
    assert kk.kernel_for(key(20)) is not own and kk.stats["served checks"] == 2


def test_a_failed_refinement_counts_its_untuned_call_once_and_beyond_the_edge_nothing_is_precompiled(tmp_path):
    kk = make_keyed(tmp_path / "db.sqlite", refine=lambda e, b, c: {"block_M": 64, "block_N": "x"},
                    validate=lambda k, c: ["a grid past the limit"] if k["M"] > 64 else [])
    for m in (20, 25, 40):
        a, b = args(m)
        torch.testing.assert_close(kk(a, b), a * 2 + b)
    assert kk.untuned() == [(key(64), 3)]
    with pytest.raises(autotuner.KeyRefused, match="cannot run at"):
        kk.served_config(key(100))  # beyond the last edge (64), where validate refuses the bucket's config
    assert kk.precompile([key(100)]) == 0
