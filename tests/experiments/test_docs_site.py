"""The documentation site: its generated pages (a page per registry entry, the benchmark
results), its strict build, and the built site in headless Chromium at 1,280 and 390 px.

The build needs the ``docs`` extra and skips without it; the browser checks need Chromium and
skip without it, except in CI (the environment variable CI set, as ``.ci/run`` does), where a
missing browser is a failure, as in the report's browser test.
"""

import dataclasses
import html
import importlib
import os
import re
from pathlib import Path

import pytest

from linattn import registry
from linattn.experiments import docs_site, report_browser

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1280, 390)
PUBLIC = ("ops", "layers", "models", "compat", "registry", "testing", "integrations")


@pytest.fixture(scope="module")
def accuracy():
    # Small problems: what is checked here is that every form of every entry gets its row.
    return docs_site.accuracy_rows(T=24, K=4, V=4)


@pytest.fixture(scope="module")
def bench():
    return docs_site.load_bench_rows()


def test_every_mechanism_page_has_its_formula_names_accuracy_and_speed(accuracy, bench):
    measured = {row["mechanism"] for row in bench["rows"]}
    for entry in registry.mechanisms():
        page = docs_site.mechanism_page(entry, accuracy, bench)
        assert page.startswith(f"# {entry.title}\n")
        assert f"`{entry.transition}`" in page and f"`{entry.write}`" in page
        for name in (*entry.fla_names, *entry.transformers_names):
            assert f"`{name}`" in page, (entry.name, name)
        accuracy_part = page.split("## Accuracy", 1)[1].split("## Speed", 1)[0]
        forms = re.findall(r"^\| (parallel|recurrent|chunk) \|", accuracy_part, re.M)
        assert forms == list(entry.forms), (entry.name, forms)
        speed = page.split("## Speed", 1)[1]
        if entry.name in measured:
            rows = [r for r in bench["rows"] if r["mechanism"] == entry.name]
            assert len(re.findall(r"^\| (parallel|recurrent|chunk) \|", speed, re.M)) == len(rows)
            assert f"{rows[0]['forward_s'] * 1e3:,.1f}" in speed
        else:
            assert "has no row for this mechanism" in speed


def test_a_mechanism_registered_later_gets_a_page_and_a_place_in_the_navigation(accuracy, bench):
    entry = dataclasses.replace(registry.get("delta"), name="docs_test_rule", title="A test rule")
    registry.register(entry)
    try:
        config = {"nav": [{"Home": "index.md"}, {"Mechanisms": "mechanisms/index.md"}]}
        docs_site.on_config(config)
        assert {"A test rule": "mechanisms/docs_test_rule.md"} in config["nav"][1]["Mechanisms"]
        assert "[A test rule](docs_test_rule.md)" in docs_site.mechanisms_index(
            registry.mechanisms()
        )
        page = docs_site.mechanism_page(entry, accuracy, bench)
        assert page.startswith("# A test rule") and "has no row for this mechanism" in page
    finally:
        registry.unregister("docs_test_rule")


def test_markers_are_filled_and_a_marker_without_content_fails():
    text = "before\n<!-- linattn: bench-table -->\nafter"
    assert docs_site.fill_markers(text, {"bench-table": "| a |"}) == "before\n| a |\nafter"
    with pytest.raises(KeyError, match="bench-table"):
        docs_site.fill_markers(text, {})


def test_every_marker_in_the_pages_is_one_the_generator_fills():
    pytest.importorskip("matplotlib")  # the plots of the benchmark pages
    parts, images = docs_site.benchmark_content()
    parts |= docs_site.table_content(registry.mechanisms())
    for page in (ROOT / "docs").rglob("*.md"):
        for name in docs_site.MARKER.findall(page.read_text()):
            assert name in parts, (page, name)
    for name, text in parts.items():  # the report's own words stay in the report
        assert "this report" not in text and "Machine, below" not in text, name
    for plot in ("bench", "mqar", "state-tracking"):  # drawn wide, and again for a phone
        assert images[f"{docs_site.FIGURES_DIR}/{plot}.png"].startswith(b"\x89PNG")
        assert images[f"{docs_site.FIGURES_DIR}/{plot}-narrow.png"].startswith(b"\x89PNG")


# -- the strict build -----------------------------------------------------------------------------


def _docs_extra() -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra: pip install -e '.[docs]'")


def _build(config_file: Path, site: Path, **overrides) -> None:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(str(config_file), site_dir=str(site), strict=True, **overrides))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built from this repository in strict mode (a warning fails the build)."""
    _docs_extra()
    out = tmp_path_factory.mktemp("docs") / "site"
    _build(ROOT / "mkdocs.yml", out)
    return out


def test_the_site_has_a_page_per_mechanism_and_the_plots(site):
    for entry in registry.mechanisms():
        assert (site / "mechanisms" / f"{entry.name}.html").is_file(), entry.name
    for plot in ("bench", "mqar", "state-tracking"):
        assert (site / "benchmarks" / "figures" / f"{plot}-narrow.png").is_file()
    assert (site / "search" / "search_index.json").is_file()


def test_the_api_reference_documents_every_public_name(site):
    from linattn.compat.unsupported import MISSING

    for name in PUBLIC:
        module = importlib.import_module(f"linattn.{name}")
        text = (site / "api" / f"{name}.html").read_text()
        ids = set(re.findall(r'id="(linattn\.[^"]+)"', text))
        for member in getattr(module, "__all__", ()):
            if name == "compat" and member in MISSING:  # made at import time, from that table
                assert "linattn.compat.unsupported.MISSING" in ids
                # its value as written, quoted either way (mkdocstrings formats it with ruff
                # or black where one is installed)
                shown = html.unescape(re.sub(r"<[^>]*>", "", text))
                assert f"'{member}'" in shown or f'"{member}"' in shown, member
                continue
            # A re-exported object is documented at its own name or where it is defined.
            assert any(i == f"linattn.{name}.{member}" or i.endswith(f".{member}") for i in ids), (
                name,
                member,
            )


def test_the_strict_build_fails_on_a_broken_link(tmp_path):
    """The validation settings of mkdocs.yml, on a page with a broken link: the build fails."""
    _docs_extra()
    import yaml
    from mkdocs.exceptions import Abort

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    small = {key: config[key] for key in ("site_name", "theme", "validation", "strict")}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({**small, "docs_dir": str(docs)}))
    with pytest.raises(Abort, match="strict mode"):
        _build(tmp_path / "mkdocs.yml", tmp_path / "site")


# -- in Chromium ----------------------------------------------------------------------------------

CHROMIUM = report_browser.find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"), reason="no Chromium (apt-get install chromium)"
)


def _chromium() -> str:
    if CHROMIUM is None:
        pytest.fail("CI needs Chromium for the browser test: apt-get install chromium")
    return CHROMIUM


def _pages(site: Path) -> list[str]:
    return sorted(
        str(p.relative_to(site))
        for p in site.rglob("*.html")
        if not p.name.startswith(".") and p.name != "404.html"
    )


@pytest.fixture(scope="module", params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def seen(request, site):
    width = request.param
    return width, docs_site.inspect_site(site, _pages(site), width, "gated delta", _chromium())


@needs_chromium
def test_no_page_scrolls_sideways(seen, site):
    width, result = seen
    assert set(_pages(site)) <= set(result)
    for page in _pages(site):
        seen_page = result[page]
        assert seen_page["viewport"] == width, page
        assert seen_page["page"] <= width, (page, seen_page["overflowing"][:5])
        assert seen_page["overflowing"] == [], (page, seen_page["overflowing"][:5])


@needs_chromium
def test_code_blocks_fit_or_scroll_inside_themselves(seen, site):
    width, result = seen
    blocks = [(page, b) for page in _pages(site) for b in result[page]["code"]]
    assert len(blocks) > 20
    for page, block in blocks:
        assert block["fits"] or block["scrolls"], (width, page, block)
        assert block["right"] <= width, (width, page, block)
    if width == 390:  # some blocks are wider than a phone, and scroll there
        assert any(not block["fits"] for _, block in blocks)


@needs_chromium
def test_plots_load_whole_on_the_screen_and_narrow_on_a_phone(seen):
    width, result = seen
    for page in (
        "benchmarks/speed.html",
        "benchmarks/recall.html",
        "benchmarks/state-tracking.html",
    ):
        images = result[page]["images"]
        assert images, page
        for image in images:
            assert image["loaded"] and image["right"] <= width, (page, image)
            assert image["shown"].endswith("-narrow.png") == (width < 600), (page, image)


@needs_chromium
def test_search_finds_the_mechanism(seen):
    _, result = seen
    search = result["search"]
    assert search["results"] > 0, search
    assert "/mechanisms/gated_delta.html" in search["first"], search


@needs_chromium
def test_the_probe_sees_a_page_that_scrolls_sideways(tmp_path):
    """The checks above can fail: a page with a wide box and a wide code block that does not
    scroll is reported, where a code block that scrolls is not."""
    page = tmp_path / "wide.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width"></head>'
        '<body><div class="md-content"><div style="width: 700px">wide</div>'
        '<pre><code style="white-space: pre; overflow: visible">' + "x" * 200 + "</code></pre>"
        '<pre><code style="white-space: pre; overflow-x: auto; display: block">'
        + "y" * 200
        + "</code></pre></div></body></html>"
    )
    result = docs_site.inspect_site(tmp_path, ["wide.html"], 390, "", _chromium())["wide.html"]
    assert result["page"] > 390
    assert any(item.startswith("div") for item in result["overflowing"])
    assert [(b["fits"], b["scrolls"]) for b in result["code"]] == [(False, False), (False, True)]


def test_the_compat_table_lists_every_entry_point_with_its_mechanism_or_why_not():
    from linattn import compat, registry

    table = docs_site.compat_table("m/")
    names = {*compat.FLA_ENTRY_POINTS, *compat.FLA_SUBMODULE_ENTRY_POINTS}
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(names)
    for name in names:
        (row,) = [r for r in rows if r.startswith(f"| `{name}` |")]
        entry = registry.with_fla_name(name)
        if name in compat.FLA_OTHER_ENTRY_POINTS:
            assert "computed; not a mechanism over tokens" in row, name
        elif entry is None:
            assert "not computed: " in row, name
        else:
            assert f"](m/{entry.name}.md)" in row and ", ".join(entry.forms) in row, name
    computed = sum(
        registry.with_fla_name(name) is not None or name in compat.FLA_OTHER_ENTRY_POINTS
        for name in names
    )
    assert table.startswith(f"{computed} of these {len(names)} names compute.")


def test_the_mechanism_table_gives_forms_and_the_nearest_mechanism():
    import dataclasses

    from linattn import registry

    entry = dataclasses.replace(registry.get("gla"), name="x", nearest="scalar_decay")
    (row,) = docs_site.mechanism_table([entry], "m/").splitlines()[2:]
    assert row.endswith(
        "| additive, channel | parallel, recurrent, chunk | [`scalar_decay`](m/scalar_decay.md) |"
    )


def test_the_fla_model_census_is_a_table_of_every_family():
    rows = [
        {"family": "gla", "status": "runs", "decode_error": 3.5e-7},
        {"family": "cat", "status": "fails", "step": "backward", "error": "NotImplementedError",
         "frame": "fla/models/cat/modeling_cat.py:84 in forward"},
    ]  # fmt: skip
    table = docs_site.fla_models_table(rows)
    assert table.startswith("1 of fla 0.6.0's 2 model families run")
    assert "`enable()`.\n" in table  # no family without a cache: no word about one
    assert "| `gla` | runs (decode 3.5e-07) | |" in table
    assert "| `cat` | fails | backward: NotImplementedError, `fla/models/cat/" in table
    rows.append({"family": "deltaformer", "status": "runs", "prefix_error": 1.8e-7})
    rows.append({"family": "abc", "status": "fails", "step": "decode", "error": "AssertionError",
                 "message": "prefill + decode logits differ from the forward's: 5.99e-02",
                 "frame": ""})  # fmt: skip
    table = docs_site.fla_models_table(rows)
    assert table.startswith("2 of fla 0.6.0's 4 model families run")
    assert "; 1 of them without a KV cache, which fla's model lacks" in table
    assert "| `deltaformer` | runs without a KV cache (prefix 1.8e-07) | |" in table
    assert "| `abc` | fails | decode: AssertionError, prefill + decode logits differ" in table
    assert "No census is committed" in docs_site.fla_models_table(None)
