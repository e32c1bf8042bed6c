"""How good the carver's ranking is, scored offline against grids measured on a GPU (no GPU needed).

A *grid file* is what ``benchmarks/measure_gemm_grid.py``, ``measure_hints.py`` and ``gemv.py`` write:
``{"summary": {"family": ..., "device": ..., <problem fields>, "hints": [...]}, "results": [{"config",
"ms", "correct"}, ...]}`` (``family`` absent means matmul). For each file :func:`score_grid` reports

* **recall@k** for k = 1..16: the grid's best measured latency divided by the best measured latency
  among the first k configs of a ranked list (1.0 = the best config is in the top k). Three lists:
  ``tilecarve hints`` (the carver's top 16 now, or for attention grids of both programs what tuning measures:
  ``_attention_hints``; hints the file has no measurement for are skipped and
  counted), ``tilecarve rank`` (the model's order of the measured configs: every entry is measured,
  so it judges the model alone) and ``TileLang hints`` (TileLang 0.1.15's own carver: recorded in
  measure_gemm_grid.py's files, compiled and timed in the same run as the grid; or computed offline by
  ``benchmarks/tilelang_hints.py`` into ``tilelang_hints.json`` beside other files, where only the hints
  inside the measured grid can be scored);
* Spearman's rho between predicted and measured latency over the legal measured configs, and the
  measured configs the validity rules drop (with the best of them, to show no winner was lost).

:func:`write_report` draws the figures; ``benchmarks/hint_quality.py`` and the notebook
``examples/notebooks/hint_quality.ipynb`` are built on these functions.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DATA_ROOT", "FAMILIES", "KS", "Family", "Grid", "data_root", "load_grids", "mispredictions",
           "recall_curve", "save_report", "score_grid", "spearman", "write_report"]

logger = logging.getLogger(__name__)

#: The measured data shipped in a source checkout (absent from an installed wheel: pass a directory).
DATA_ROOT = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
#: The k of the recall curves.
KS = tuple(range(1, 17))
TILECARVE_HINTS, TILECARVE_RANK, TILELANG_HINTS = "tilecarve hints", "tilecarve rank", "TileLang hints"


@dataclass(frozen=True)
class Family:
    """How to score one kernel family's grids. ``model(summary, arch)`` builds the carver's model of
    the file's problem (it needs ``.rank(configs)`` -> ``Ranking``); ``hints(model, summary, arch, k)``
    gives the carver's top k configs as the tuner measures them (a grid may fix its own k: attention's of both
    programs; None: the model's rank of the grid);
    ``defaults``: config keys a file may omit at their default value; ``keys()``: the config keys the
    family has now (None: any), so rows of a knob since removed are skipped and counted, not scored;
    ``config()``: the family's config class, whose ``from_dict(c).to_dict()`` spells every config one way
    (a default a file writes out, ``"tma": true`` say, then matches the hint that leaves it out)."""

    model: Callable[[Mapping[str, Any], Any], Any]
    hints: Callable[[Any, Mapping[str, Any], Any, int], list[dict[str, Any]]] | None = None
    defaults: Mapping[str, int] = field(default_factory=dict)
    keys: Callable[[], tuple[str, ...]] | None = None
    config: Callable[[], Any] | None = None


def _matmul_model(s: Mapping[str, Any], arch: Any) -> Any:
    from carver import MatmulTemplate

    dtype = s.get("dtype", "float16")
    return MatmulTemplate(int(s["M"]), int(s["N"]), int(s["K"]), in_dtype=dtype,
                          out_dtype=s.get("out_dtype", dtype)).with_arch(arch)


def _gemv_problem(s: Mapping[str, Any]) -> Any:
    from templates.gemv.config import GemvProblem

    return GemvProblem(int(s["M"]), int(s["N"]), int(s["K"]), dtype=s.get("dtype", "float16"))


def _gemv_model(s: Mapping[str, Any], arch: Any) -> Any:
    from templates.gemv.space import carver_template

    return carver_template(_gemv_problem(s), arch)


def _gemv_hints(model: Any, s: Mapping[str, Any], arch: Any, k: int) -> list[dict[str, Any]]:
    from templates.gemv.space import candidates

    # the ranked top-k, as for the other families: the cp.async variants tune() appends are not hints
    return [c.to_dict() for c in candidates(_gemv_problem(s), arch, k, variants=False)]


def _attention_problem(s: Mapping[str, Any]) -> Any:
    from carver.attention import AttentionProblem

    return AttentionProblem(**s["problem"])


def _attention_model(s: Mapping[str, Any], arch: Any) -> Any:
    from templates.attention.space import carver_template

    return carver_template(_attention_problem(s), arch)


def _attention_hints(model: Any, s: Mapping[str, Any], arch: Any, k: int) -> list[dict[str, Any]]:
    """The ranked top-k. For a grid of both programs (``"variants": true``, ``benchmarks/attention_ws.py``), what
    tuning measures at the grid's ``topk`` instead (that plain top-k and the ws configs it adds: the grid measured
    them all), in the model's order of predicted latency, so that hints@8 is the best of the 8 of them the model
    expects fastest; ``k`` does not widen it."""
    from templates.attention.space import candidates

    if not s.get("variants"):
        return [c.to_dict() for c in candidates(_attention_problem(s), arch, k, variants=False)]
    got = candidates(_attention_problem(s), arch, int(s["topk"]), variants=True)
    return [c.to_dict() for c in sorted(got, key=lambda c: model.predict(c.kernel_kwargs()).latency_ms)]


def _attention_keys() -> tuple[str, ...]:
    from carver.attention import ATTENTION_KEYS, ATTENTION_OPTIONAL_KEYS

    return ATTENTION_KEYS + tuple(ATTENTION_OPTIONAL_KEYS)


#: One entry per family the grids may name (``summary["family"]``). A new family adds one line.
FAMILIES: dict[str, Family] = {
    "matmul": Family(_matmul_model, lambda m, s, a, k: [h.to_config() for h in m.recommend_hints(topk=k)],
                     defaults={"panel_size": 10, "split_k": 1},
                     config=lambda: _config_class("matmul", "MatmulConfig")),
    "gemv": Family(_gemv_model, _gemv_hints, defaults={"split_k": 1},
                   config=lambda: _config_class("gemv", "GemvConfig")),
    "attention": Family(_attention_model, _attention_hints, keys=_attention_keys, defaults={"variant": "pipelined"},
                        config=lambda: _config_class("attention", "AttentionConfig")),
}


def _config_class(family: str, name: str) -> Any:
    """``templates.<family>.config.<name>``, imported when first scored."""
    import importlib

    return getattr(importlib.import_module(f"templates.{family}.config"), name)


@dataclass(frozen=True)
class Grid:
    """One measured file: its path, summary and the correct measured rows; ``unknown_keys``: rows (any
    status) whose config has keys the family's config no longer has, skipped."""

    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    unknown_keys: int = 0

    @property
    def family(self) -> str:
        return str(self.summary.get("family", "matmul"))

    @property
    def label(self) -> str:
        return self.path.stem


def data_root() -> Path:
    """Where the measured grids are: ``$TILECARVE_DATA``, else the first ``benchmarks/data`` found from
    the working directory upwards (a notebook runs in ``examples/notebooks``), else the checkout's."""
    if os.environ.get("TILECARVE_DATA"):
        return Path(os.environ["TILECARVE_DATA"])
    for d in (Path.cwd(), *Path.cwd().parents):
        if (d / "benchmarks" / "data").is_dir():
            return d / "benchmarks" / "data"
    if DATA_ROOT.is_dir():
        return DATA_ROOT
    raise FileNotFoundError("no benchmarks/data here or above, and tilecarve is not a source checkout: "
                            "set TILECARVE_DATA to a directory of measured grids")


def _read_json(f: Path) -> Any:
    """The JSON document in ``f``, or a ``ValueError`` naming the file and what is wrong with it."""
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read {f}: {e.strerror or e}") from e
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{f} is not valid JSON ({e})") from e


def load_grids(*paths: str | os.PathLike[str]) -> list[Grid]:
    """Every grid file under ``paths`` (files or directories, searched recursively), sorted by path.
    Other JSON files (summaries, benchmark boards) are skipped. In a directory, a ``*.json`` file that cannot
    be read as JSON (another program's, or a grid cut short), or whose ``summary``/``results`` are not an object
    and a list, is skipped too, with a warning naming it: a folder such as /tmp holds files that are none of
    ours. Such a file named in ``paths`` itself is a ``ValueError`` naming it. A path with no grid raises."""
    found: list[Grid] = []
    unread: list[str] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist: pass a directory of measured grids, e.g. {DATA_ROOT}")
        scan = p.is_dir()
        for f in sorted(p.rglob("*.json")) if scan else [p]:
            try:
                data = _read_json(f)
                if not (isinstance(data, dict) and {"summary", "results"} <= data.keys()):
                    continue  # other JSON: a summary, a benchmark board
                if not isinstance(data["summary"], dict) or not isinstance(data["results"], list):
                    raise ValueError(f"{f} has 'summary' and 'results' but is no measured grid: they are "
                                     f"{type(data['summary']).__name__} and {type(data['results']).__name__}, "
                                     "expected an object and a list")
            except ValueError as e:
                if not scan:
                    raise
                unread.append(str(f))
                logger.warning("%s; skipped (only measured grids are scored)", e)
                continue
            found.append(Grid(f, data["summary"], data["results"]))
    if not found:
        more = ", ..." if len(unread) > 3 else ""
        also = (f" ({len(unread)} *.json files that could not be read as grids were skipped: "
                f"{', '.join(unread[:3])}{more})" if unread else "")
        raise FileNotFoundError(f"no measured grid (a JSON file with 'summary' and 'results') under "
                                f"{', '.join(map(str, paths))}{also}")
    unknown = sorted({g.family for g in found} - FAMILIES.keys())
    if unknown:
        raise ValueError(f"grids of family {unknown} have no entry in tilecarve.quality.FAMILIES "
                         f"(known: {sorted(FAMILIES)}); add one")
    return sorted((_known_rows(g) for g in found), key=lambda g: (g.family, str(g.path)))


def _known_rows(g: Grid) -> Grid:
    """``g`` with its correct, timed rows whose keys the family still has (``g.rows`` holds all rows here)."""
    keys = FAMILIES[g.family].keys
    have = None if keys is None else set(keys())
    known = [r for r in g.rows if have is None or set(r["config"]) <= have]
    rows = [r for r in known if r.get("ms") and r.get("correct")]
    return Grid(g.path, g.summary, rows, len(g.rows) - len(known))


def _key(cfg: Mapping[str, Any], fam: Family) -> tuple:
    """A config's identity within its family: its canonical spelling, defaults left out."""
    if fam.config is not None:
        try:
            cfg = fam.config().from_dict(cfg).to_dict()
        except Exception:  # noqa: BLE001 - a config the class refuses is compared as the file writes it
            pass

    def value(v: Any) -> Any:
        if isinstance(v, str):
            return v
        return int(v) if isinstance(v, (bool, int, float)) else json.dumps(v, sort_keys=True)

    return tuple(sorted((k, value(v)) for k, v in cfg.items() if fam.defaults.get(k) != v))


def recall_curve(ms: list[float | None], best_ms: float, ks: tuple[int, ...] = KS) -> list[float | None]:
    """``best_ms / min(measured ms among the first k)`` for each k (None: none of them measured, or the
    list is shorter than k)."""
    out: list[float | None] = []
    for k in ks:
        got = [m for m in ms[:k] if m is not None]
        out.append(best_ms / min(got) if got and k <= len(ms) else None)
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank)."""
    import numpy as np

    def ranks(v: list[float]) -> Any:
        a = np.asarray(v, dtype=float)
        order = np.argsort(a, kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for val in np.unique(a):  # average the ranks of ties
            r[a == val] = r[a == val].mean()
        return r

    if len(x) < 2:
        raise ValueError(f"Spearman's rho needs at least 2 points, got {len(x)}")
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def _tilelang_hints(g: Grid) -> tuple[list[dict[str, Any]], str] | None:
    """TileLang's carver hints and where they come from: ``recorded`` in the file (measure_gemm_grid.py
    compiled and timed them with the grid; measure_hints.py and gemv.py record tilecarve's own hints),
    or ``computed offline`` by benchmarks/tilelang_hints.py into ``tilelang_hints.json`` beside it."""
    if g.family != "matmul":
        return None
    hints = g.summary.get("hints")
    if hints and g.summary.get("carver") != "tilecarve":
        hints = ast.literal_eval(hints) if isinstance(hints, str) else hints
        return [h["config"] for h in hints], "recorded"
    side = g.path.parent / "tilelang_hints.json"
    if side.is_file():
        got = json.loads(side.read_text())["hints"].get(g.label)
        if got:
            return got, "computed offline"
    return None


def score_grid(g: Grid, arch: Any = None, k: int = max(KS)) -> dict[str, Any]:
    """Score the carver on one measured file (see the module doc). ``arch``: a ``carver.arch`` name or
    object; None takes the file's ``device``. The result is JSON-able."""
    from carver.arch import CUDA

    fam = FAMILIES[g.family]
    arch = CUDA(arch or g.summary.get("device") or "H200") if arch is None or isinstance(arch, str) else arch
    if not g.rows:
        raise ValueError(f"{g.path} has no correct measured config to score against")
    measured = {_key(r["config"], fam): r["ms"] for r in g.rows}
    best = min(g.rows, key=lambda r: r["ms"])
    model = fam.model(g.summary, arch)
    ranking = model.rank([r["config"] for r in g.rows])
    rank_ms = [measured[_key(rc.config, fam)] for rc in ranking.ranked]
    pred_ms = [rc.prediction.latency_ms for rc in ranking.ranked]
    dropped_ms = [measured[_key(d.config, fam)] for d in ranking.dropped]
    curves = {TILECARVE_RANK: recall_curve(rank_ms, best["ms"])}
    unmeasured: dict[str, int] = {}
    hints_s = None
    if fam.hints is not None:
        t0 = time.perf_counter()
        hints = fam.hints(model, g.summary, arch, k)
        hints_s = time.perf_counter() - t0
        ms = [measured.get(_key(h, fam)) for h in hints]
        curves[TILECARVE_HINTS] = recall_curve(ms, best["ms"])
        unmeasured[TILECARVE_HINTS] = sum(m is None for m in ms[: max(KS)])
    tl = _tilelang_hints(g)
    if tl:
        ms = [measured.get(_key(h, fam)) for h in tl[0]]
        curves[TILELANG_HINTS] = recall_curve(ms, best["ms"])
        unmeasured[TILELANG_HINTS] = sum(m is None for m in ms[: max(KS)])
    return dict(
        family=g.family, label=g.label, file=str(g.path), device=g.summary.get("device"), arch=arch.name,
        best_ms=best["ms"], best_config=best["config"], n_measured=len(g.rows), n_unknown_keys=g.unknown_keys,
        n_legal=len(rank_ms), n_dropped=len(dropped_ms),
        dropped_best_fraction=best["ms"] / min(dropped_ms) if dropped_ms else None,
        spearman=spearman(pred_ms, rank_ms) if len(rank_ms) > 1 else None,
        recall=curves, unmeasured=unmeasured, hints_s=hints_s, tilelang_hints=tl[1] if tl else None,
        ranked=dict(configs=[rc.config for rc in ranking.ranked], predicted_ms=pred_ms, measured_ms=rank_ms),
    )


def mispredictions(score: Mapping[str, Any], n: int = 5) -> list[dict[str, Any]]:
    """Where the model is most wrong on one file: the legal measured configs whose predicted latency is
    furthest from the measured one (by ``|log(predicted / measured)|``), worst first, with the rank
    each got from the model and from the measurement."""
    r = score["ranked"]
    by_ms = sorted(range(len(r["measured_ms"])), key=lambda i: r["measured_ms"][i])
    true_rank = {i: pos + 1 for pos, i in enumerate(by_ms)}
    err = [(abs(math.log(p / m)), i) for i, (p, m) in enumerate(zip(r["predicted_ms"], r["measured_ms"]))]
    return [dict(config=r["configs"][i], predicted_ms=r["predicted_ms"][i], measured_ms=r["measured_ms"][i],
                 ratio=r["predicted_ms"][i] / r["measured_ms"][i], model_rank=i + 1, measured_rank=true_rank[i])
            for _, i in sorted(err, reverse=True)[:n]]


def _figure(**kw: Any) -> Any:
    """A bare matplotlib Figure: no pyplot, so no backend is chosen or changed (a notebook keeps its own)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("the hint-quality figures need matplotlib, which is not installed: "
                          "pip install matplotlib (or the project's extra: pip install -e '.[test]')") from e
    return Figure(**kw)


def _axes(n: int, cols: int = 4, size: float = 4.0) -> tuple[Any, list[Any]]:
    cols = min(n, cols)
    rows = -(-n // cols)
    fig = _figure(figsize=(size * cols, size * rows))
    flat = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def plot_scatter(scores: list[dict[str, Any]], path: Path) -> Path:
    """Predicted against measured latency, one panel per file; the diagonal is a perfect model."""
    fig, axes = _axes(len(scores))
    for ax, s in zip(axes, scores):
        meas = [m * 1e3 for m in s["ranked"]["measured_ms"]]
        pred = [p * 1e3 for p in s["ranked"]["predicted_ms"]]
        ax.scatter(meas, pred, s=6, alpha=0.5)
        ax.scatter(meas[:8], pred[:8], s=30, facecolors="none", edgecolors="red", label="model's top 8")
        lo, hi = min(meas + pred), max(meas + pred)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        rho = "-" if s["spearman"] is None else f"{s['spearman']:.3f}"
        ax.set(xscale="log", yscale="log", xlabel="measured (us)", ylabel="predicted (us)")
        ax.tick_params(which="minor", labelbottom=False, labelleft=False)
        _title(ax, f"{s['family']} {s['label']}\nrho={rho}, {s['device']}", legend="upper left")
    return _save(fig, path)


def plot_recall(scores: list[dict[str, Any]], path: Path) -> Path:
    """recall@k curves per file: tilecarve's hints, its rank of the grid, TileLang's hints."""
    fig, axes = _axes(len(scores))
    style = {TILECARVE_HINTS: "o-", TILECARVE_RANK: "s--", TILELANG_HINTS: "x-"}
    for ax, s in zip(axes, scores):
        for name, curve in s["recall"].items():
            pts = [(k, v) for k, v in zip(KS, curve) if v is not None]
            notes = [s["tilelang_hints"]] if name == TILELANG_HINTS else []
            if s["unmeasured"].get(name):
                notes.append(f"{s['unmeasured'][name]}/{max(KS)} unmeasured, skipped")
            label = name + (f" ({', '.join(notes)})" if notes else "")
            if pts:
                ax.plot(*zip(*pts), style[name], ms=3, label=label)
        ax.set_xticks([1, 4, 8, 12, 16])
        ax.set(ylim=(0, 1.05), xlabel="k", ylabel="best of top k / best measured")
        _title(ax, f"{s['family']} {s['label']}", legend="lower right")
    return _save(fig, path)


def plot_spearman(scores: list[dict[str, Any]], path: Path) -> Path:
    """Spearman's rho per file, one bar each."""
    fig = _figure(figsize=(max(6.0, 0.5 * len(scores) + 2), 4))
    ax = fig.subplots()
    labels = [f"{s['family']} {s['label']}" for s in scores]
    ax.bar(range(len(scores)), [s["spearman"] or 0.0 for s in scores])
    ax.set_xticks(range(len(scores)), labels, rotation=60, ha="right", fontsize=7)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(ylim=(-1, 1), ylabel="Spearman rho (predicted vs measured)")
    return _save(fig, path)


def _title(ax: Any, title: str, legend: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc=legend)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def _row(s: Mapping[str, Any]) -> dict[str, Any]:
    """A score without its per-config arrays: what the summary keeps."""
    return {k: v for k, v in s.items() if k != "ranked"}


def write_report(data_dir: Path, out_dir: Path, arch: str | None = None) -> dict[str, Any]:
    """Score every grid under ``data_dir`` and write ``predicted_vs_measured.png``, ``recall_at_k.png``,
    ``spearman.png`` and ``hint_quality.json`` (every score) into ``out_dir``. Returns a JSON-able
    summary: per family the number of files, the mean and worst recall@1/@8 of each ranked list and the
    worst rho; per file its scores (without the per-config arrays); and the written paths."""
    return save_report([score_grid(g, arch) for g in load_grids(data_dir)], out_dir, str(data_dir), arch)


def save_report(scores: list[dict[str, Any]], out_dir: Path, data: str, arch: str | None = None) -> dict[str, Any]:
    """:func:`write_report` for scores already computed (``data`` names where they came from)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = dict(scatter=plot_scatter(scores, out / "predicted_vs_measured.png"),
                 recall=plot_recall(scores, out / "recall_at_k.png"),
                 spearman=plot_spearman(scores, out / "spearman.png"), json=out / "hint_quality.json")
    summary = dict(data=data, arch=arch, families=family_summary(scores), files=[_row(s) for s in scores],
                   paths={k: str(v) for k, v in paths.items()})
    paths["json"].write_text(json.dumps(dict(summary, scores=scores), indent=1))
    return summary


def family_summary(scores: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family: files, worst rho, and mean/worst recall@1 and @8 of each ranked list."""
    families: dict[str, Any] = {}
    for fam in sorted({s["family"] for s in scores}):
        mine = [s for s in scores if s["family"] == fam]
        rhos = [s["spearman"] for s in mine if s["spearman"] is not None]
        agg: dict[str, Any] = dict(files=len(mine), spearman_min=min(rhos) if rhos else None)
        for name in (TILECARVE_HINTS, TILECARVE_RANK, TILELANG_HINTS):
            for k in (1, 8):
                vals = [s["recall"][name][k - 1] for s in mine if name in s["recall"]]
                vals = [v for v in vals if v is not None]
                if vals:
                    agg[f"{name} recall@{k}"] = dict(mean=sum(vals) / len(vals), min=min(vals), files=len(vals))
        families[fam] = agg
    return families
