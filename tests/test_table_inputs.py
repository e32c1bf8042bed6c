"""Tuned tables and keyed kernels fed bad or unusual inputs (docs/deploy.md): provenance of re-written entries,
entry configs and key values checked at load, unreadable files, ``allow``, key values and bucket specs, an
empty recording, and the file a table is written to. Nothing here compiles or times a kernel."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from kernels.keyed_kernels import CONFIGS, make_keyed

import autotuner
from autotuner import TableError, load_table, record, write_table
from autotuner.buckets import as_buckets
from autotuner.table import Entry, KernelSection
from autotuner.target import resolve_target

NAME = "kernels.keyed_kernels.scale_add"


def key(m: int, n=64, dtype="float32") -> dict:
    return {"M": m, "N": n, "dtype": dtype}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECARVE_CACHE_DIR", str(tmp_path / "cache"))
    yield
    autotuner.use_table(None)
    import gc

    gc.collect()


@pytest.fixture
def kk(tmp_path):
    return make_keyed(tmp_path / "tuning.sqlite")


def _table(kk, path: Path, entries=None, name=None) -> Path:
    entries = entries or ((key(8), CONFIGS[0]), (key(64), CONFIGS[1]))
    sec = KernelSection(name or kk.name, kk.source(), kk.key, {"M": (8, 64)},
                        tuple(Entry(dict(k), dict(c), 0.1) for k, c in entries))
    return write_table(path, [sec], resolve_target("c"))


def _edit(path: Path, change) -> Path:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return path


def _entry0(doc) -> dict:
    return doc["kernels"][NAME]["entries"][0]


# ------------------------------------------------------------------------- 1: provenance of re-written entries
@pytest.mark.parametrize("field,change", [
    ("gpu", lambda d: d.update(gpu="NVIDIA H100")),
    ("tilelang", lambda d: d.update(tilelang="0.0.1")),
    ("source", lambda d: d["kernels"][NAME].update(source="0" * 64)),
])
def test_entries_of_a_table_loaded_with_allow_are_not_rewritten_as_native(kk, tmp_path, field, change):
    foreign = _edit(_table(kk, tmp_path / "foreign.json"), change)
    kk.use_table(foreign, allow=[field])
    assert kk.config_for(key(3)) == (CONFIGS[0], "table")
    out = tmp_path / "out.json"
    with pytest.raises(TableError, match=rf"{out}: not writing kernels.{NAME} entry .*{field}.*allow=\['{field}'\]"):
        write_table(out, [kk.section()], kk.target())
    assert not out.exists()
    table = load_table(foreign, target="c", allow=[field])
    if field != "source":  # the loaded sections as they are: stamped with this target, refused too
        with pytest.raises(TableError, match=f"field '{field}'"):
            write_table(out, table.kernels.values(), kk.target())
    assert not out.exists()


def test_entries_of_a_native_table_are_rewritten(kk, tmp_path):
    kk.use_table(_table(kk, tmp_path / "native.json"))
    kk.config_for(key(3))
    again = write_table(tmp_path / "again.json", [kk.section()], kk.target())
    assert [e.config for e in load_table(again, target="c").kernels[NAME].entries] == [CONFIGS[0]]


# ------------------------------------------------------------------------- 2: entry configs checked at load
BAD_CONFIGS = [
    ({"block_M": -16}, "block_M is -16, but block_M must be a positive int"),
    ({"block_M": 0}, "block_M is 0, but block_M must be a positive int"),
    ({"block_M": 10**30}, "block_M is 1000000000000000000000000000000, an int outside 64 bits"),
    ({"thread_num": 2**31}, "thread_num is 2147483648, but thread_num must be a positive int below 2"),
    ({"block_M": None}, "block_M is null, not a value; a config value is an int"),
    ({"block_M": "64"}, r'block_M is "64", but block_M must be'),
    ({"block_M": 16.5}, "block_M is 16.5, but"),
    ({"block_M": True}, "block_M is true, but"),
    ({"num_stages": -1}, "num_stages is -1, but num_stages must be an int >= 0"),
    ({"num_stages": False}, "num_stages is false, but"),
    ({"enable_rasterization": 1}, "enable_rasterization is 1, but enable_rasterization must be a bool"),
    ({"block_N": [64]}, r"block_N is \[64\], a JSON array"),
    ({"block_N": {"a": 1}}, r"block_N is \{\"a\": 1\}, a JSON object"),
    ({"M": 128}, "config.M sets the key parameter 'M'"),
    ({"pass_configs": {"tl.x": None}}, r"pass_configs.tl.x is null"),
]


@pytest.mark.parametrize("config,message", BAD_CONFIGS)
def test_an_entry_config_is_checked_at_load(kk, tmp_path, config, message):
    p = _edit(_table(kk, tmp_path / "t.json"), lambda d: _entry0(d).update(config=config))
    with pytest.raises(TableError, match=message) as e:
        load_table(p, target="c")
    assert f"{p}: kernels.{NAME}.entries[0].config." in str(e.value) and "fix the value" in str(e.value) or \
        "remove 'M'" in str(e.value)


def test_every_reserved_parameter_has_a_domain():
    from autotuner.config import RESERVED_PARAMS
    from autotuner.table import _RESERVED_DOMAINS

    assert set(_RESERVED_DOMAINS) == set(RESERVED_PARAMS)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_config_value_is_refused(kk, tmp_path, literal):
    p = _table(kk, tmp_path / "t.json")
    p.write_text(p.read_text().replace('"block_M": 16', f'"block_M": {literal}', 1))
    with pytest.raises(TableError, match=f"config.block_M is {literal}, not a finite number"):
        load_table(p, target="c")


def test_other_config_values_still_load(kk, tmp_path):
    cfg = {"block_M": 16, "num_stages": 0, "enable_rasterization": True, "scale": 0.5, "layout": "nt",
           "pass_configs": {"tl.disable_warp_specialized": True}}
    p = _edit(_table(kk, tmp_path / "t.json"), lambda d: _entry0(d).update(config=cfg))
    assert load_table(p, target="c").kernels[NAME].entries[0].config == cfg


# ------------------------------------------------------------------------- 3: exact key values, type-strict
def test_exact_key_values_match_type_strictly(kk, tmp_path):
    p = _edit(_table(kk, tmp_path / "t.json"), lambda d: _entry0(d)["key"].update(N=True))
    kk.use_table(p)
    assert kk.config_for(key(8, n=1))[1] == "fallback"  # an entry "N": true does not serve N=1
    assert kk.config_for(key(8, n=True)) == (CONFIGS[0], "table")


def test_served_kernels_tell_a_bool_key_from_an_int(kk, tmp_path, monkeypatch):
    """The per-key choice, the compiled kernels and the fast path too: True == 1 and hash alike in a dict."""
    kk.use_table(_table(kk, tmp_path / "t.json", entries=((key(8, n=True), CONFIGS[1]),)))
    monkeypatch.setattr(kk, "_compile", lambda exact, config: ("kernel", exact["N"], dict(config)))
    monkeypatch.setattr(kk, "_check_served", lambda *a: None)  # stand-in kernels: nothing to run
    for _ in range(2):
        assert kk.kernel_for(key(8, n=1)) == ("kernel", 1, CONFIGS[0])  # the fallback
        assert kk.kernel_for(key(8, n=True)) == ("kernel", True, CONFIGS[1])  # the table
        assert kk.kernel_for_values((8, 1, "float32"))[2] == CONFIGS[0]
        assert kk.kernel_for_values((8, True, "float32"))[2] == CONFIGS[1]
    assert kk.untuned() == [(key(8, n=1), 4)]


@pytest.mark.parametrize("literal,shown", [("64.0", "64.0"), ("NaN", "NaN"), ("null", "null")])
def test_a_key_value_no_call_can_match_is_refused(kk, tmp_path, literal, shown):
    p = _table(kk, tmp_path / "t.json")
    p.write_text(p.read_text().replace('"N": 64', f'"N": {literal}', 1))
    with pytest.raises(TableError, match=rf"{p}: kernels.{NAME}.entries\[0\].key.N is {shown}, which no call can"):
        load_table(p, target="c")


# ------------------------------------------------------------------------- 4: unreadable files, repeated names
def test_a_binary_or_deeply_nested_file_is_a_table_error(tmp_path):
    binary = tmp_path / "bin.json"
    binary.write_bytes(b'{"format": "\xff\xfe"}')
    with pytest.raises(TableError, match=f"{binary}: not a tuned table: byte 0xff at offset 12 is not UTF-8"):
        load_table(binary, target="c")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000 + "]" * 200000)
    with pytest.raises(TableError, match=f"{deep}: not a tuned table: its JSON is nested too deeply"):
        load_table(deep, target="c")


@pytest.mark.parametrize("name,edit", [
    ("gpu", lambda t: t.replace('"gpu": ', '"gpu": "x", "gpu": ', 1)),
    (NAME, lambda t: t.replace('"kernels": {', '"kernels": {' + json.dumps(NAME) + ': {}, ', 1)),
    ("N", lambda t: t.replace('"N": 64', '"N": 64, "N": 65', 1)),
])
def test_a_repeated_name_is_refused(kk, tmp_path, name, edit):
    p = _table(kk, tmp_path / "t.json")
    p.write_text(edit(p.read_text()))
    json.loads(p.read_text())  # plain JSON takes it (the last wins)
    with pytest.raises(TableError, match=f"{p}: the name '{name}' appears twice in one JSON object"):
        load_table(p, target="c")


# ------------------------------------------------------------------------- 5: allow
def test_allow_takes_one_name_or_a_list(kk, tmp_path):
    p = _edit(_table(kk, tmp_path / "t.json"), lambda d: d.update(gpu="NVIDIA H100"))
    assert load_table(p, target="c", allow="gpu").allow == {"gpu"}
    with pytest.raises(TableError, match="field 'gpu'"):
        load_table(p, target="c", allow="target")
    with pytest.raises(TypeError, match=r"allow is 1; give True .* a field name such as 'gpu', or a list"):
        load_table(p, target="c", allow=1)
    with pytest.raises(ValueError, match=r"allow names \['gpus'\]"):
        load_table(p, target="c", allow="gpus")


# ------------------------------------------------------------------------- 6: a table without this kernel
def test_a_table_without_the_kernel_warns_once_naming_what_it_holds(kk, tmp_path, caplog):
    p = _table(kk, tmp_path / "t.json", name="renamed.scale_add")
    table = load_table(p, target="c")
    with caplog.at_level(logging.INFO, logger="autotuner.keyed"):
        for _ in range(2):
            kk.use_table(table)
            assert kk.config_for(key(3))[1] == "fallback"
    warned = [r for r in caplog.records if "no section for this kernel" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    msg = warned[0].getMessage()
    assert kk.name in msg and str(p) in msg and "renamed.scale_add (key ['M', 'N', 'dtype'])" in msg
    assert "name='renamed.scale_add'" in msg  # the same source under another name


# ------------------------------------------------------------------------- 7, 8: key values, bucket specs
def test_a_tensor_is_not_a_key_value(kk):
    with pytest.raises(TypeError, match=rf"{kk.name}: key 'N' is a tensor .*pass an int, e.g. x.shape\[0\]"):
        kk.make_key(key(8, n=torch.tensor(64)))
    assert kk.make_key(key(8, dtype=torch.float16))["dtype"] == "float16"


@pytest.mark.parametrize("m", [0, "8", -3, True])
def test_a_bad_bucketed_value_names_kernel_and_key(kk, m):
    with pytest.raises(ValueError, match=rf"{kk.name}: key 'M' is bucketed, so its value must be a positive int, "
                                         rf"got {m!r}"):
        kk.make_key(key(m))


def test_a_numpy_array_of_edges_is_a_bucket_spec():
    assert as_buckets("M", np.array([8, 64])).edges == (8, 64)
    with pytest.raises(ValueError, match=r"buckets\['M'\]: a bucket edge must be a positive int"):
        as_buckets("M", np.array([0.5, 8]))


# ------------------------------------------------------------------------- 9: an empty recording
def test_tuning_an_empty_recording_warns_and_writes_nothing(tmp_path, caplog):
    out = tmp_path / "x.json"
    with record() as rec:
        pass
    with caplog.at_level(logging.WARNING, logger="autotuner.record"):
        assert rec.tune(out, progress=False) is None
    assert not out.exists()
    assert any("nothing was recorded" in r.getMessage() and str(out) in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------- 10: the file written
def test_a_written_table_keeps_the_mode_of_the_file_it_replaces(kk, tmp_path):
    old = os.umask(0o022)
    try:
        fresh = _table(kk, tmp_path / "fresh.json")
        assert fresh.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
    shipped = tmp_path / "shipped.json"
    shipped.write_text("{}")
    shipped.chmod(0o640)
    _table(kk, shipped)
    assert shipped.stat().st_mode & 0o777 == 0o640 and load_table(shipped, target="c").kernels[NAME]


def test_a_table_is_synced_before_the_rename_and_a_failed_write_leaves_no_temporary(kk, tmp_path, monkeypatch):
    calls = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), replace(a, b))[1])
    _table(kk, tmp_path / "t.json")
    assert calls[:2] == ["fsync", "replace"]

    def fail(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        _table(kk, tmp_path / "t2.json")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["t.json"]
