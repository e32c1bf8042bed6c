"""``benchmarks/attention_ab.py`` (no GPU): a variant's constants hold while its programs are built, are put back
after, and a constant the program module lacks is refused by name."""

import sys
from pathlib import Path

import pytest

from templates.attention import AttentionProblem
from templates.attention import ws_program as W

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

CFG = {"block_M": 128, "block_N": 64, "num_stages": 2, "threads": 256, "variant": "ws"}


def test_a_variant_builds_its_programs_under_its_constants_and_puts_them_back():
    from attention_ab import build

    progs = build(AttentionProblem(1, 4, 256, 64), {"c": CFG}, {"new": {}, "old": {"PRODUCER_WARPS": 4}})
    assert W.PRODUCER_WARPS == 1
    new, old = (progs[f"c/{v}"].get().script() for v in ("new", "old"))
    # the producer's loop: its first warp (256 consumer threads + 32), or all four warps (the pre-change program)
    assert "if tx < 288:" in new and "if tx < 288:" not in old and "if tx < 384:" in old


def test_a_constant_the_module_lacks_is_refused_by_name():
    from attention_ab import build

    with pytest.raises(SystemExit, match=r"\['POLY_EXP2_EVERY'\].*PRODUCER_WARPS"):
        build(AttentionProblem(1, 4, 256, 64), {"c": CFG}, {"x": {"POLY_EXP2_EVERY": 8}})
    assert W.PRODUCER_WARPS == 1


def test_a_config_the_program_refuses_is_a_result():
    from attention_ab import build

    progs = build(AttentionProblem(1, 4, 256, 64), {"bad": {**CFG, "block_M": 64}}, {"new": {}})
    bad = progs["bad/new"]
    assert bad.program is None and "block_M" in str(bad.error)
    from benchlib import compile_all

    ((item, kernel, _, error),) = compile_all(None, None, [bad], 1, build=type(bad).get)  # no compile tried
    assert item is bad and kernel is None and error.startswith("ValueError: ") and "block_M" in error
