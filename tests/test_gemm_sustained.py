"""``benchmarks/gemm_sustained.py`` without a GPU: how it reads configs, refuses bad arguments before touching
CUDA, and turns interleaved rounds into issue 14's target table (medians per mode, ratios to cuBLAS, geomeans)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gemm_sustained as gs  # noqa: E402

ENV = {"device": "a GPU", "date": "2026-12-07 16:00 UTC"}


def test_a_board_label_and_a_json_config_are_read_and_a_bad_one_is_named():
    assert gs.parse_config("128x256x64 s3 t256 r full_row persistent132") == dict(
        block_M=128, block_N=256, block_K=64, enable_rasterization=True, num_stages=3, thread_num=256,
        warp_policy="full_row", persistent=132)
    ws = '{"block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 4, "variant": "ws"}'
    assert gs.parse_config(ws)["variant"] == "ws"
    for bad, words in [("128x2 s3", "BMxBNxBK"), ("128x256x64 q3", "'q3'"), ("{1}", "is not JSON")]:
        with pytest.raises(ValueError, match=words):
            gs.parse_config(bad)


@pytest.mark.parametrize("argv, words", [
    ([], "nothing to time"),
    (["--tuned", "--dtypes", "fp8"], "'fp8' unknown"),
    (["--configs", "128x2"], "BMxBNxBK"),
    (["--tuned", "--rounds", "0"], "at least 1"),
])
def test_bad_arguments_are_refused_before_any_gpu_work(argv, words, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        gs.main(["--out", str(tmp_path), "--shapes", "64x64x64", *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def rounds(cublas: list[float], tuned: list[float], mode: str) -> list[dict]:
    out = []
    for r, (c, t) in enumerate(zip(cublas, tuned)):
        out += [dict(round=r, mode=mode, kernel="cublas", tflops=c, **{"clocks.sm": "1500 MHz"}),
                dict(round=r, mode=mode, kernel="tuned", tflops=t, **{"clocks.sm": "1490 MHz"})]
    return out


def test_the_report_takes_medians_per_mode_and_states_each_target():
    fast = dict(M=4096, N=4096, K=4096, dtype="float16", configs={"tuned": {"block_M": 128}},
                rounds=rounds([700, 710, 720], [720, 740, 730], "burst")
                + rounds([600, 610, 620], [612, 600, 630], "sustained"))
    slow = dict(M=2048, N=14336, K=4096, dtype="bfloat16", configs={"tuned": {"block_M": 256}},
                rounds=rounds([700, 700, 700], [665, 670, 680], "burst")
                + rounds([600, 600, 600], [600, 600, 600], "sustained"))
    failed = dict(M=8192, N=8192, K=8192, dtype="float16", configs={}, rounds=[], error="time limit: not run")
    text = gs.report([fast, slow, failed], ENV, ["gemm_sustained.py", "--tuned"])
    # burst medians 730/710 and 670/700; sustained 612/610 and 600/600
    assert "| 4096x4096x4096 | float16 | tuned | 1.028 | 1.003 | " in text
    assert "| 2048x14336x4096 | bfloat16 | tuned | 0.957 | 1.000 | " in text
    assert "| 8192x8192x8192 | float16 | | failed: time limit: not run" in text
    assert "| geomean vs cuBLAS, sustained | >= 1.0 | 1.002 | yes |" in text
    assert "| geomean vs cuBLAS, bursts | >= 1.02 | 0.992 | no |" in text
    assert "| no case below 0.97 (either mode) | >= 0.97 | 0.957 | no |" in text
    assert "2 cases timed of 3." in text


def test_the_kernels_take_turns_at_coming_first(monkeypatch):
    """``time_round`` with the timer and nvidia-smi replaced: the order each round really times the kernels in."""
    from types import SimpleNamespace

    import autotuner.timing

    names = ["cublas", "tuned", "128x256x64 s3 t256 r"]
    calls: list[tuple[str, int]] = []
    fns = {n: (lambda n=n: n) for n in names}

    def fake_time(fn, warmup, rep, device):
        calls.append((fn(), rep))
        return SimpleNamespace(median_ms=1.0)

    monkeypatch.setattr(autotuner.timing, "time_callable", fake_time)
    monkeypatch.setattr(gs, "gpu_state", lambda: {"clocks.sm": "1500 MHz"})
    args = SimpleNamespace(burst=20, sustained=400)
    rows = [row for r in range(3) for row in gs.time_round(fns, dict(M=1, N=1, K=1), r, args)]
    firsts = [calls[i][0] for i in range(0, len(calls), 3)]  # who led each mode of each round
    assert firsts == ["cublas", "cublas", "tuned", "tuned", "128x256x64 s3 t256 r", "128x256x64 s3 t256 r"]
    assert [rep for _, rep in calls] == [20] * 3 + [400] * 3 + [20] * 3 + [400] * 3 + [20] * 3 + [400] * 3
    assert len(rows) == 18 and all(r["tflops"] == 2e-9 for r in rows)


def test_the_board_rotates_which_kernel_it_times_first(monkeypatch):
    """``gemm.measure`` (the board's rounds) on the CPU, its timer replaced by a log of what it timed."""
    import gemm
    import torch

    def inputs(c):
        return torch.ones(c["M"], c["K"]), torch.ones(c["N"], c["K"])

    timed: list[str] = []

    def fake_time(fn):
        out = fn()
        timed.append("cublas" if getattr(fn, "func", None) is gemm._cublas_nt else "ours")
        return float(out.sum())

    monkeypatch.setattr(gemm, "_inputs", inputs)
    monkeypatch.setattr(gemm, "_time_ms", fake_time)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    row = gemm.measure(dict(M=4, N=4, K=4), {"ours": lambda a, b: a @ b.T})
    # two kernels: 4 rounds (3 raised to whole rotations), each kernel first in two
    assert timed == ["cublas", "ours", "ours", "cublas", "cublas", "ours", "ours", "cublas"]
    assert row["ours_err"] == 0 and len(row["ours_round_ms"]) == 4 and gemm._ROUNDS == 3
    timed.clear()
    gemm.measure(dict(M=4, N=4, K=4), {"ours": lambda a, b: a @ b.T, "triton": lambda a, b: a @ b.T})
    assert len(timed) == 9  # three kernels: 3 rounds
