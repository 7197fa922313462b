"""The documentation site's generated pages, and the MkDocs hooks that add them to the build.

``mkdocs.yml`` names this file as a hook, so ``mkdocs build`` and ``mkdocs serve`` call
``on_config``, ``on_files`` and ``on_page_markdown`` below. Two kinds of page content come from
the code and the committed results rather than from prose under ``docs/``:

- **one page per mechanism** of ``linattn.registry`` (``mechanisms/NAME.md``) and their index:
  the formula, the forms, the layer, the fla and transformers names from the entry; the accuracy
  of every form, computed at build time by ``linattn.experiments.accuracy``; the speed of every
  form from the committed ``linattn bench`` results where the file has rows for it. A mechanism
  registered later gets its page, and its place in the navigation, with no edit here;
- **the benchmark results** (the tables and plots of ``benchmarks/results``): a hand-written page
  under ``docs/benchmarks`` holds a marker such as ``<!-- linattn: bench-table -->`` where the
  generated table goes, and the plots are drawn at build time by the report's own plotting code
  (``linattn.figures.plots``, ``linattn.experiments.state_tracking.results``), twice: for a wide
  screen and for a phone, served by a ``<picture>``.

Everything here is a function of the registry and the results files; nothing is copied by hand.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository the site is built from
RESULTS = ROOT / "benchmarks" / "results"
BENCH_FILE = RESULTS / "bench.json"
MQAR_FILE = RESULTS / "mqar-cpu.jsonl"
STATE_TRACKING_FILE = RESULTS / "state-tracking-default.jsonl"

# The accuracy problem of the mechanism pages: smaller than ``linattn accuracy``'s default
# (T = 1000) so that the build stays quick; the page states the sizes it was computed at.
ACCURACY_T, ACCURACY_K, ACCURACY_V, ACCURACY_SEED = 256, 16, 16, 0
MECHANISMS_DIR = "mechanisms"
FIGURES_DIR = "benchmarks/figures"
MARKER = re.compile(r"<!-- linattn: ([a-z0-9-]+) -->")
GATE_TEXT = {
    "none": "none",
    "head": "one log-decay per head, `g [B, T, H]`",
    "channel": "one log-decay per key channel, `g [B, T, H, K]`",
}


# -- the mechanism pages ------------------------------------------------------------------------


def accuracy_rows(
    T: int = ACCURACY_T, K: int = ACCURACY_K, V: int = ACCURACY_V, seed: int = ACCURACY_SEED
) -> list[dict]:
    """Every registered mechanism and form against its float64 oracle
    (``linattn.experiments.accuracy.compute_accuracy``)."""
    from linattn.experiments.accuracy import compute_accuracy

    return compute_accuracy(T=T, K=K, V=V, seed=seed)


def load_bench_rows(path: Path = BENCH_FILE) -> dict | None:
    """The committed ``linattn bench`` run (its ``config``, ``machine`` and ``rows``), or None."""
    return json.loads(path.read_text()) if path.is_file() else None


def _code_list(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names) if names else "none"


def _qualified(path: Any) -> str | None:
    """``"linattn.ops:delta_rule"`` -> ``"linattn.ops.delta_rule"``; None for an object that a
    user's module registered itself (it has no page in the API reference)."""
    if isinstance(path, str):
        return path.replace(":", ".")
    return None


def _api_link(path: Any, obj: Any) -> str:
    """A cross-reference into the API reference for a ``linattn`` object, else its name.

    The target is where the object is defined (``linattn.ops.delta_rule.delta_rule``), which the
    API reference registers for every object it renders, re-exported or not; autorefs resolves
    it, and a target the reference lacks fails the strict build."""
    name = _qualified(path)
    if obj is None:
        return "none"
    if name is None or not name.startswith("linattn."):
        return f"`{getattr(obj, '__qualname__', repr(obj))}`"
    return f"[`{name}`][{obj.__module__}.{obj.__qualname__}]"


def mechanism_page(entry: Any, accuracy: Sequence[dict], bench: dict | None) -> str:
    """The Markdown page of one registry entry."""
    if entry.case.cost == "softmax":
        memory = "no fixed memory: its state is the KV cache, which grows with t"
    elif entry.rule is None:  # a memory with its own op (several parts, a nonlinear update)
        memory = "its own fixed memory (the op's docstring), not one rule of `linattn.ops.rules`"
    else:
        memory = "`S_t = A_t S_{t-1} + k_t w_t^T`, read as `o_t = S_t^T q_t`"
    rows = [
        ("memory", memory),
        ("transition `A_t`", f"`{entry.transition}`"),
        ("write `w_t`", f"`{entry.write}`"),
        ("rule", f"`{entry.rule}`" if entry.rule else "none"),
        ("gate", GATE_TEXT[entry.gate]),
        ("op", _api_link(entry.op_path, entry.op)),
        ("float64 oracle", f"`{_qualified(entry.reference_path) or entry.name}`"),
        ("forms", ", ".join(f"`{form}`" for form in entry.forms)),
        ("layer", _api_link(entry.layer_path, entry.layer)),
        ("`LMConfig` mixer", f"`{entry.mixer}`" if entry.mixer else "none"),
        ("preset", f"`{entry.preset}`" if entry.preset else "none"),
        ("fla 0.6.0 entry points (`linattn.compat`)", _code_list(entry.fla_names)),
        (
            "transformers model types (`linattn.integrations.transformers`)",
            _code_list(entry.transformers_names),
        ),
        ("defined in", entry.paper or "-"),
        ("spec section", entry.section or "-"),
    ]
    lines = [
        f"# {entry.title}",
        "",
        f"Registry name `{entry.name}` (`linattn.registry.get({entry.name!r})`). This page is "
        "generated from the registry entry and the committed results when the site is built.",
        "",
        "| field | value |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in rows),
        "",
        "## Accuracy",
        "",
        *accuracy_section(entry.name, accuracy),
        "",
        "## Speed",
        "",
        *speed_section(entry.name, bench),
        "",
    ]
    return "\n".join(lines)


def accuracy_section(name: str, accuracy: Sequence[dict]) -> list[str]:
    """The accuracy table of one mechanism: a row per form."""
    mine = [row for row in accuracy if row["name"] == name]
    if not mine:
        return ["No accuracy rows: `linattn accuracy` has no case for this mechanism."]
    return [
        f"Computed when this site was built, by `linattn accuracy --T {ACCURACY_T} --K "
        f"{ACCURACY_K} --V {ACCURACY_V} --seed {ACCURACY_SEED}` (B = 1, two heads, an initial "
        "state, chunk size 64): each form against the float64 oracle, the largest absolute error "
        "in float64, and in the other dtypes the error's RMS relative to the oracle's (the inputs "
        "rounded to the dtype first).",
        "",
        "| form | float64 | float32 | bfloat16 | float16 |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {r['form']} | {r['float64']:.1e} | {r['float32']:.1e} | {r['bfloat16']:.1e} "
            f"| {r['float16']:.1e} |"
            for r in mine
        ),
    ]


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:,.1f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def speed_section(name: str, bench: dict | None) -> list[str]:
    """The committed benchmark rows of one mechanism, or a line saying there are none."""
    rows = [row for row in (bench or {}).get("rows", []) if row.get("mechanism") == name]
    if not rows:
        return [
            f"`{BENCH_FILE.relative_to(ROOT)}` has no row for this mechanism. "
            f"`linattn bench --mechanisms {name}` measures it on your machine."
        ]
    lines = [
        f"From `{BENCH_FILE.relative_to(ROOT)}`, the committed `linattn bench` run "
        "([how it was measured](../benchmarks/speed.md)); efficiency is the section-9 operation "
        "count per second over a large float32 matrix product's rate in the same run.",
        "",
        "| form | T | forward ms | forward efficiency | forward + backward ms "
        "| forward + backward efficiency |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: (r["mode"], r["T"])):
        lines.append(
            f"| {row['mode']} | {row['T']:,} | {_ms(row.get('forward_s'))} "
            f"| {_ratio(row.get('forward_efficiency'))} | {_ms(row.get('forward_backward_s'))} "
            f"| {_ratio(row.get('forward_backward_efficiency'))} |"
        )
    return lines


def mechanism_table(entries: Sequence[Any], pages: str = "") -> str:
    """The registry as a Markdown table, each title a link to ``pages + NAME.md``: the name,
    the transition and write, the rule and gate, the forms and the nearest mechanism."""
    lines = [
        "| mechanism | transition `A_t` | write `w_t` | rule, gate | forms | nearest |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        nearest = f"[`{e.nearest}`]({pages}{e.nearest}.md)" if e.nearest else ""
        lines.append(
            f"| [{e.title}]({pages}{e.name}.md) (`{e.name}`) | `{e.transition}` | `{e.write}` "
            f"| {e.rule or 'none'}, {e.gate} | {', '.join(e.forms)} | {nearest} |"
        )
    return "\n".join(lines)


def compat_table(pages: str = "") -> str:
    """fla 0.6.0's entry points as ``linattn.compat`` serves them: each name, the fla module it
    comes from, and the registry mechanism that computes it (with its forms and nearest), or
    why it is not computed."""
    from linattn import compat, registry

    names = sorted({*compat.FLA_ENTRY_POINTS, *compat.FLA_SUBMODULE_ENTRY_POINTS})
    computed = sum(
        registry.with_fla_name(name) is not None or name in compat.FLA_OTHER_ENTRY_POINTS
        for name in names
    )
    lines = [
        f"{computed} of these {len(names)} names compute. `fla.ops` exports "
        f"{len(compat.FLA_ENTRY_POINTS)} of them; the others come from one op module each.",
        "",
        "| entry point | fla module | mechanism | forms | nearest |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        module = compat.FLA_SUBMODULE_ENTRY_POINTS.get(name, "fla.ops")
        entry = registry.with_fla_name(name)
        if entry is None and name in compat.FLA_OTHER_ENTRY_POINTS:
            what = "computed; not a mechanism over tokens (attention residuals: over layers)"
            lines.append(f"| `{name}` | `{module}` | {what} | | |")
            continue
        if entry is None:
            why = compat.MISSING.get(name) or "deprecated: raises in fla 0.6.0 too"
            lines.append(f"| `{name}` | `{module}` | not computed: {why} | | |")
            continue
        nearest = f"[`{entry.nearest}`]({pages}{entry.nearest}.md)" if entry.nearest else ""
        lines.append(
            f"| `{name}` | `{module}` | [{entry.title}]({pages}{entry.name}.md) "
            f"| {', '.join(entry.forms)} | {nearest} |"
        )
    return "\n".join(lines)


def fla_models_table(rows: Sequence[dict] | None) -> str:
    """``benchmarks/fla_models.py``'s census (``results/fla-models.json``) as a table: each of
    fla's model families, whether it runs under ``enable()``, and where a failure stops."""
    if not rows:
        return "No census is committed: `PYTHONPATH=src python benchmarks/fla_models.py` runs it."
    runs = [r for r in rows if r.get("status") == "runs"]
    uncached = [r for r in runs if "prefix_error" in r]
    lines = [
        f"{len(runs)} of fla 0.6.0's {len(rows)} model families run forward, backward, greedy "
        "`generate` and prefill + decoding (within 1e-4 of the forward) on the CPU under "
        "`enable()`"
        + (
            f"; {len(uncached)} of them without a KV cache, which fla's model lacks (generated "
            "without one, each prefix's last logits within 1e-4 of the forward's)."
            if uncached
            else "."
        ),
        "",
        "| family | result | where it stops |",
        "|---|---|---|",
    ]
    for r in rows:
        if r.get("status") == "runs" and "prefix_error" in r:
            result = f"runs without a KV cache (prefix {r['prefix_error']:.1e})"
            lines.append(f"| `{r['family']}` | {result} | |")
        elif r.get("status") == "runs":
            lines.append(f"| `{r['family']}` | runs (decode {r['decode_error']:.1e}) | |")
        else:
            # a check out of tolerance has no frame: its message gives the error
            detail = f"`{r['frame']}`" if r.get("frame") else r.get("message", "")
            where = f"{r.get('step', '')}: {r.get('error', '')}, {detail}"
            lines.append(f"| `{r['family']}` | fails | {where} |")
    return "\n".join(lines)


def mechanisms_index(entries: Sequence[Any]) -> str:
    """The Mechanisms section's first page: every entry in the registry's order."""
    lines = [
        "# Mechanisms",
        "",
        "Every mechanism of the registry (`linattn.registry`), in its order; each has a page "
        "generated from its entry when the site is built: its formula, forms, layer, fla and "
        "transformers names, accuracy and speed. [The one memory](../concepts/memory.md) says "
        "what the columns mean.",
        "",
        mechanism_table(entries),
    ]
    return "\n".join(lines) + "\n"


# -- the benchmark results ------------------------------------------------------------------------


def _picture(name: str, alt: str) -> str:
    """A plot drawn twice: ``NAME-narrow.png`` on a screen under 600 px, ``NAME.png`` else."""
    return (
        f'<picture><source media="(max-width: 600px)" srcset="figures/{name}-narrow.png">'
        f'<img src="figures/{name}.png" alt="{alt}"></picture>'
    )


def _figure_png(draw: Callable[[bool], Any]) -> tuple[bytes, bytes]:
    """The PNG bytes of a figure drawn wide and narrow (``draw(narrow)`` returns the Figure)."""
    from linattn.figures import style

    out = []
    for narrow in (False, True):
        figure = draw(narrow)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=style.DPI, bbox_inches="tight",
                       metadata={"Software": None})  # fmt: skip
        style.pyplot().close(figure)
        out.append(buffer.getvalue())
    return out[0], out[1]


def _measured_on(setup: str) -> str:
    """A setup sentence of the report without its pointer to the report's own Machine table."""
    return re.sub(
        r"; (not necessarily the machine this report|this report's machine).*$", ".", setup
    )


def bench_table(bench: dict) -> str:
    """Every chunk-form row of the benchmark, with the softmax comparison and peak memory."""
    from linattn import registry

    names = set(registry.names())
    lines = [
        "| mechanism | form | T | fwd ms | fwd eff. | fwd+bwd ms | fwd+bwd eff. "
        "| peak MiB fwd+bwd | softmax / this |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in bench["rows"]:
        peak = row.get("forward_backward_peak_bytes")
        name = row["mechanism"]
        link = f"[{name}](../{MECHANISMS_DIR}/{name}.md)" if name in names else name
        lines.append(
            f"| {link} | {row['mode']} | {row['T']:,} "
            f"| {_ms(row.get('forward_s'))} | {_ratio(row.get('forward_efficiency'))} "
            f"| {_ms(row.get('forward_backward_s'))} "
            f"| {_ratio(row.get('forward_backward_efficiency'))} "
            f"| {'' if peak is None else f'{peak / 2**20:,.0f}'} "
            f"| {_ratio(row.get('softmax_over_this_forward'))} |"
        )
    return "\n".join(lines)


def generation_table(bench: dict) -> str:
    """The generation step against a softmax decoding step over a KV cache of t tokens."""
    lines = [
        "| cached tokens t | softmax step ms | linear attention step ms | delta rule step ms "
        "| softmax / delta rule |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in bench.get("generation", []):
        lines.append(
            f"| {row['t']:,} | {row['softmax_step_s'] * 1e3:.3f} "
            f"| {row['linear_step_s'] * 1e3:.3f} | {row['delta_step_s'] * 1e3:.3f} "
            f"| {row['softmax_over_delta']:,.0f}x |"
        )
    return "\n".join(lines)


def benchmark_content(root: Path = ROOT) -> tuple[dict[str, str], dict[str, bytes]]:
    """The generated parts of the benchmark pages: ``{marker: Markdown}`` and ``{path under the
    docs: PNG bytes}``, from the committed results under ``root/benchmarks/results``."""
    from linattn.experiments import report_setup
    from linattn.experiments.mqar.summary import results_table as mqar_table
    from linattn.experiments.state_tracking import results as st
    from linattn.figures import plots
    from linattn.results_files import bench_results, load_mqar, read_results

    results = root / "benchmarks" / "results"
    parts: dict[str, str] = {}
    images: dict[str, bytes] = {}

    def source(path: Path) -> str:
        return f"From `{path.relative_to(root)}`."

    bench_path = results / BENCH_FILE.name
    if bench_path.is_file():
        bench = json.loads(bench_path.read_text())
        data = bench_results(bench)
        setup = _measured_on(report_setup.bench_setup(data))
        parts["bench-setup"] = source(bench_path) + " " + setup
        parts["bench-table"] = bench_table(bench)
        parts["bench-generation"] = generation_table(bench)
        parts["bench-plot"] = _picture("bench", "time of one forward pass against T")
        wide, narrow = _figure_png(lambda n: plots.bench_figure(data, narrow=n))
        images |= {f"{FIGURES_DIR}/bench.png": wide, f"{FIGURES_DIR}/bench-narrow.png": narrow}

    mqar_path = results / MQAR_FILE.name
    rows = load_mqar(mqar_path) if mqar_path.is_file() else None
    if rows:
        from linattn.experiments.mqar.data import filler_name

        parts["mqar-setup"] = source(mqar_path) + " " + _measured_on(report_setup.mqar_setup(rows))
        tables = []
        for fillers in dict.fromkeys(filler_name(row) for row in rows):
            mine = [row for row in rows if filler_name(row) == fillers]
            tables += [f"**Fillers: {fillers}**", "", mqar_table(mine), ""]
        parts["mqar-table"] = "\n".join(tables)
        parts["mqar-plot"] = _picture("mqar", "recall accuracy against state size")
        wide, narrow = _figure_png(lambda n: plots.mqar_figure(rows, narrow=n))
        images |= {f"{FIGURES_DIR}/mqar.png": wide, f"{FIGURES_DIR}/mqar-narrow.png": narrow}

    gpu_path = results / "gpu.json"
    committed = json.loads(gpu_path.read_text()) if gpu_path.is_file() else None
    if committed is not None and committed.get("setup", {}).get("smoke"):
        committed = None  # a smoke run (CPU tensors under the interpreter) measures nothing
    parts["gpu-table"] = report_setup.gpu_table(committed)

    st_path = results / STATE_TRACKING_FILE.name
    if st_path.is_file():
        summaries = st.aggregate(read_results(st_path))
        parts["state-tracking-setup"] = (
            source(st_path) + " " + report_setup.state_tracking_setup(read_results(st_path))
        )
        parts["state-tracking-table"] = st.results_table(summaries)
        parts["state-tracking-plot"] = _picture(
            "state-tracking", "state-tracking accuracy against test length"
        )
        wide, narrow = _figure_png(lambda n: st.figure(summaries, narrow=n))
        images |= {
            f"{FIGURES_DIR}/state-tracking.png": wide,
            f"{FIGURES_DIR}/state-tracking-narrow.png": narrow,
        }
    return parts, images


def table_content(entries: Sequence[Any], root: Path = ROOT) -> dict[str, str]:
    """The generated tables of the concept, API and guide pages: the mechanisms, fla's entry
    points in ``linattn.compat``, and the census of fla's model families."""
    census = root / "benchmarks" / "results" / "fla-models.json"
    return {
        "mechanism-table": mechanism_table(entries, f"../{MECHANISMS_DIR}/"),
        "compat-table": compat_table(f"../{MECHANISMS_DIR}/"),
        "fla-models-table": fla_models_table(
            json.loads(census.read_text()) if census.is_file() else None
        ),
    }


def generate(root: Path = ROOT) -> tuple[dict[str, str], dict[str, str | bytes]]:
    """Everything the build adds: ``({marker: Markdown}, {path under the docs: page or image})``."""
    from linattn import registry

    entries = registry.mechanisms()
    accuracy = accuracy_rows()
    bench = load_bench_rows(root / "benchmarks" / "results" / BENCH_FILE.name)
    files: dict[str, str | bytes] = {f"{MECHANISMS_DIR}/index.md": mechanisms_index(entries)}
    for entry in entries:
        files[f"{MECHANISMS_DIR}/{entry.name}.md"] = mechanism_page(entry, accuracy, bench)
    parts, images = benchmark_content(root)
    parts |= table_content(entries, root)
    files.update(images)
    return parts, files


def fill_markers(markdown: str, parts: dict[str, str]) -> str:
    """``markdown`` with each ``<!-- linattn: NAME -->`` replaced by ``parts[NAME]``; a marker
    without content fails, so that a page never shows a hole silently."""

    def content(match: re.Match) -> str:
        name = match.group(1)
        if name not in parts:
            raise KeyError(f"no generated content for the marker {match.group(0)}")
        return parts[name]

    return MARKER.sub(content, markdown)


# -- MkDocs hooks ---------------------------------------------------------------------------------

_generated: tuple[dict[str, str], dict[str, str | bytes]] | None = None


def _content() -> tuple[dict[str, str], dict[str, str | bytes]]:
    # Generated once per process: `mkdocs serve` rebuilds on every edit, and the accuracy and
    # the plots do not change with the prose.
    global _generated
    if _generated is None:
        _generated = generate()
    return _generated


def on_config(config: Any) -> Any:
    """Put every registered mechanism's page under the Mechanisms section of the navigation."""
    from linattn import registry

    pages = [f"{MECHANISMS_DIR}/index.md"]
    pages += [{e.title: f"{MECHANISMS_DIR}/{e.name}.md"} for e in registry.mechanisms()]
    for index, item in enumerate(config["nav"] or []):
        if isinstance(item, dict) and "Mechanisms" in item:
            config["nav"][index] = {"Mechanisms": pages}
    return config


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages and plots to the build."""
    from mkdocs.structure.files import File

    _, generated = _content()
    for path, content in generated.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill a page's ``<!-- linattn: NAME -->`` markers with the generated results."""
    parts, _ = _content()
    return fill_markers(markdown, parts)


# -- the built site in a browser ------------------------------------------------------------------

# A harness page beside the site's pages (same origin: its script reads the frame's document).
# When the frame has loaded, the probe measures the layout, types a query into Material's search
# box, waits for the results and posts everything to the server. The harness's last image is
# answered only after that post, so that Chromium's --dump-dom (which exits once the page has
# loaded) waits for the probe in real time: the search runs in a web worker, whose work a virtual
# time budget would not wait for.
SITE_PROBE = r"""<!DOCTYPE html><html><head><meta charset="utf-8">
<style>body { margin: 0; } iframe { border: 0; display: block; }</style></head><body>
<iframe id="page" width="WIDTH" height="900"></iframe>
<script>
const frame = document.getElementById("page");
const pages = PAGES;
const results = {};
const report = () => fetch("DONE", {method: "POST", body: JSON.stringify(results)});
// A box scrolls sideways inside itself when its overflow-x lets it.
const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
const measure = (doc) => {
  const width = doc.documentElement.clientWidth;
  const overflowing = [];
  for (const el of doc.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (!box.width || box.right <= width + 0.5) continue;
    if (el.closest(".md-sidebar, .md-search")) continue;  // off-canvas until opened
    let inside = false;  // within a box on the screen that scrolls: a code block, a wide table
    for (let up = el.parentElement; up && up !== doc.body; up = up.parentElement) {
      if (scrolls(up) && up.getBoundingClientRect().right <= width + 0.5) { inside = true; break; }
    }
    const name = el.className ? "." + String(el.className).split(" ")[0] : "";
    if (!inside) overflowing.push(el.tagName.toLowerCase() + name + " " + Math.round(box.right));
  }
  // A code block fits when nothing of it is hidden and it ends on the screen.
  const code = [...doc.querySelectorAll(".md-content pre > code")].map((el) => {
    const right = el.getBoundingClientRect().right;
    return {fits: el.scrollWidth <= el.clientWidth + 1 && right <= width + 0.5,
            scrolls: scrolls(el), right: Math.round(right)};
  });
  const images = [...doc.querySelectorAll(".md-content img")].map((img) => ({
    src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0,
    shown: img.currentSrc ? new URL(img.currentSrc).pathname : "",
    right: Math.round(img.getBoundingClientRect().right),
  }));
  return {viewport: width, page: doc.documentElement.scrollWidth, overflowing, code, images,
          title: doc.title};
};
// Material's search on the last page: type the query, wait for the worker's results.
const search = (doc, query) => new Promise((resolve) => {
  const input = doc.querySelector("input.md-search__input");
  if (!input) { resolve({query, results: 0, meta: "no search box"}); return; }
  const toggle = doc.getElementById("__search");  // the search overlay
  if (toggle) { toggle.checked = true; toggle.dispatchEvent(new Event("change")); }
  input.focus();
  input.value = query;
  const started = Date.now();
  const poll = () => {
    input.dispatchEvent(new Event("input", {bubbles: true}));  // again, once the index is ready
    const hits = [...doc.querySelectorAll(".md-search-result__item a")];
    if (hits.length || Date.now() - started > 30000) {
      resolve({query, results: hits.length,
               first: hits.slice(0, 5).map((a) => new URL(a.href).pathname),
               meta: (doc.querySelector(".md-search-result__meta") || {}).textContent || ""});
    } else {
      setTimeout(poll, 250);
    }
  };
  poll();
});
let index = 0;
frame.addEventListener("load", async () => {
  const doc = frame.contentDocument;
  // The empty frame may report its own load (about:blank) after this listener is attached.
  if (!doc || doc.location.href === "about:blank") return;
  results[pages[index]] = measure(doc);
  index += 1;
  if (index < pages.length) { frame.src = pages[index]; return; }
  if ("QUERY") results.search = await search(doc, "QUERY");
  report();
});
frame.src = pages[0];
</script>
<img src="WAIT" alt=""></body></html>"""
_SITE_MARK = "linattn-site-probe"


def inspect_site(
    site: Path | str,
    pages: Sequence[str],
    width: int,
    query: str = "",
    chromium: str | None = None,
) -> dict:
    """What the probe measured on each of ``pages`` (paths under the built ``site``) at a
    viewport ``width`` CSS pixels wide, ``{page: measures}``, and, with ``query``, what
    Material's search found for it on the last page (``"search"``).

    The site is served over HTTP on the loopback interface for the time of the call: its search
    runs in a web worker that fetches the search index, which a page opened from a file cannot."""
    import functools
    import http.server
    import subprocess
    import threading

    from linattn.experiments import report_browser

    chromium = chromium or report_browser.find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium found on PATH (Debian: apt-get install chromium)")
    site = Path(site).resolve()
    done, posted = threading.Event(), []
    wait_path, done_path = f"/.{_SITE_MARK}-wait", f"/.{_SITE_MARK}-done"

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keeps the test's output readable
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != wait_path:
                return super().do_GET()
            done.wait(280)
            self.send_response(204)
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            posted.append(self.rfile.read(length).decode())
            done.set()
            self.send_response(204)
            self.end_headers()

    harness = site / f".{_SITE_MARK}-{width}.html"
    harness.write_text(
        SITE_PROBE.replace("PAGES", json.dumps(list(pages)))
        .replace("WIDTH", str(width))
        .replace("QUERY", query)
        .replace("DONE", done_path)
        .replace("WAIT", wait_path)
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--window-size={max(width, report_browser.MIN_WINDOW)},900", "--dump-dom",
        f"http://127.0.0.1:{server.server_address[1]}/{harness.name}",
    ]  # fmt: skip
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
        server.server_close()
        harness.unlink()
    if not posted:
        raise RuntimeError(
            f"the probe did not report at {width} px: a page did not load "
            f"({chromium} exited with {run.returncode}: {run.stderr[-1000:]})"
        )
    return json.loads(posted[0])
