"""The data plots and the result files they read (formats in linattn.figures.plots)."""

import json

import pytest

from linattn.experiments.table1 import compute_table1
from linattn.figures import plots, style

PIL = pytest.importorskip("PIL.Image")


def bench_file(path):
    rows = [
        {"name": name, "T": T, "seconds": seconds}
        for name, scale in (("softmax", 1e-8), ("delta rule, chunk", 1e-5))
        for T, seconds in ((256, 256**2 * scale), (1024, 1024**2 * scale))
    ]
    path.write_text(json.dumps({"meta": {"device": "cpu"}, "results": rows}))
    return path


def mqar_file(path):
    rows = [
        {"mechanism": "deltanet", "state_numbers": 1024, "accuracy": 0.5, "seed": 0},
        {"mechanism": "deltanet", "state_numbers": 1024, "accuracy": 0.7, "seed": 1},
        {"mechanism": "deltanet", "state_numbers": 4096, "accuracy": 0.9},
        {"mechanism": "linear", "state_numbers": 1024, "accuracy": 0.1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def opens(path):
    with PIL.open(path) as image:
        image.load()
        return image.size


def test_table1_plot(tmp_path):
    rows = compute_table1(ns=(8, 32, 64), repetitions=3)
    png, svg = plots.table1_plot(rows, tmp_path)
    assert png.name == "table1.png" and svg.stat().st_size > 0
    assert opens(png)[0] > 500


def test_table1_plot_needs_rows(tmp_path):
    with pytest.raises(ValueError, match="non-empty list of Table 1 rows"):
        plots.table1_plot([], tmp_path)
    assert not list(tmp_path.iterdir())


def test_missing_files_are_none(tmp_path):
    assert plots.load_bench(tmp_path / "none.json") is None
    assert plots.load_mqar(tmp_path / "none.jsonl") is None


def test_bench_series_and_plot(tmp_path):
    data = plots.load_bench(bench_file(tmp_path / "bench.json"))
    series = plots.bench_series(data)
    assert series["softmax"] == [(256.0, 256**2 * 1e-8), (1024.0, 1024**2 * 1e-8)]
    png, _ = plots.bench_plot(data, tmp_path)
    assert opens(png)[0] > 500


def test_bench_name_from_method_and_mode(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps({"results": [{"method": "delta", "mode": "chunk", "T": 64, "seconds": 0.1}]})
    )
    assert list(plots.bench_series(plots.load_bench(path))) == ["delta, chunk"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not valid JSON"),
        ('{"results": []}', "non-empty list 'results'"),
        ('{"results": [{"name": "x", "T": 8}]}', "'T' and 'seconds'"),
        ('{"results": [{"T": 8, "seconds": 1.0}]}', "'name'"),
    ],
)
def test_bad_bench_file(tmp_path, content, message):
    path = tmp_path / "bench.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        plots.load_bench(path)


def test_mqar_series_average_seeds_and_plot(tmp_path):
    rows = plots.load_mqar(mqar_file(tmp_path / "mqar.jsonl"))
    series = plots.mqar_series(rows)
    assert series["deltanet"] == [(1024.0, pytest.approx(0.6), 2), (4096.0, 0.9, 1)]
    assert series["linear"] == [(1024.0, 0.1, 1)]
    png, _ = plots.mqar_plot(rows, tmp_path)
    assert opens(png)[0] > 500


def test_mqar_series_names_presets_when_several():
    rows = [
        {"mechanism": "kda", "state_numbers": 8, "accuracy": 1.0, "preset": "smoke"},
        {"mechanism": "kda", "state_numbers": 8, "accuracy": 0.5, "preset": "cpu"},
    ]
    assert sorted(plots.mqar_series(rows)) == ["kda (cpu)", "kda (smoke)"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{", "line 1: not valid JSON"),
        ('{"state_numbers": 8, "accuracy": 1}', "'mechanism'"),
        ('{"mechanism": "x", "accuracy": 1}', "'state_numbers', 'accuracy'"),
    ],
)
def test_bad_mqar_file(tmp_path, line, message):
    path = tmp_path / "mqar.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        plots.load_mqar(path)


def test_load_bench_reads_what_linattn_bench_writes(tmp_path):
    """The bench command's own file (``rows`` with mechanism, mode, T, forward_s) is read as is."""
    import json

    from linattn.figures import plots

    rows = [
        {"mechanism": "delta", "mode": "chunk", "T": T, "forward_s": 0.001 * T} for T in (64, 128)
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"config": {"B": 1}, "rows": rows}))
    data = plots.load_bench(path)
    assert plots.bench_series(data) == {"delta, chunk": [(64.0, 0.064), (128.0, 0.128)]}


def _captured(monkeypatch):
    """Replace style.save with one that keeps the figure for inspection."""
    kept = {}

    def save(fig, out_dir, name):
        kept[name] = fig
        return []

    monkeypatch.setattr(style, "save", save)
    return kept


def test_bench_plot_one_colour_per_mechanism_a_style_per_form_legends_outside(monkeypatch):
    kept = _captured(monkeypatch)
    rows = [
        {"name": f"{mechanism}, {form}", "T": T, "seconds": 1e-3 * T}
        for mechanism in ("softmax", "linear", "delta", "gla", "kda", "gated_delta", "mamba")
        for form in ("chunk", "parallel", "recurrent")
        for T in (1024, 4096)
    ]
    plots.bench_plot({"meta": {"B": 1, "H": 8, "T": [1024, 4096]}, "results": rows}, "unused")
    fig = kept["bench"]
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert len(lines) == 21
    by_series = [(line.get_color(), line.get_linestyle()) for line in lines]
    assert len({c for c, _ in by_series}) == 7  # one colour per mechanism
    assert len({s for _, s in by_series}) == 3  # one line style per form
    assert ax.get_legend() is None and len(fig.legends) == 2  # beside the axes, not on the data
    assert len(ax.get_title()) < 40 and "\n" not in ax.get_title()  # a short title


def test_mqar_plot_legend_outside_and_distinct_colours(monkeypatch):
    kept = _captured(monkeypatch)
    rows = [
        {"mechanism": m, "state_numbers": s, "accuracy": 0.5}
        for m in ("a", "b", "c", "d", "e", "f", "g", "h")
        for s in (800, 2600)
    ]
    plots.mqar_plot(rows, "unused")
    fig = kept["mqar"]
    (ax,) = fig.axes
    assert len({line.get_color() for line in ax.get_lines()}) == 8
    assert ax.get_legend() is None and len(fig.legends) == 1
