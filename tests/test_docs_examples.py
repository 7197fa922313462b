"""Every Python example of the documentation's pages runs as printed, as the README's do."""

import re
from pathlib import Path

import pytest

from tests.test_readme import run_example

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def examples() -> list[tuple[str, int, str]]:
    """(page, index, code) of every ```python block under docs/, a named script's excepted."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        found += [(str(page.relative_to(ROOT)), i, code) for i, code in enumerate(blocks)]
    return found


def test_the_pages_have_examples():
    pages = {page for page, _, _ in examples()}
    assert {"docs/index.md", "docs/concepts/ops.md", "docs/guides/models.md"} <= pages


@pytest.mark.parametrize(
    "page, index, code", examples(), ids=[f"{p}-{i}" for p, i, _ in examples()]
)
def test_docs_python_example_runs(page, index, code, tmp_path, monkeypatch):
    run_example(code, f"{page} example {index}", tmp_path, monkeypatch)


def test_context_parallel_script_runs_on_two_processes(tmp_path):
    """The guide's `cp_example.py`, launched as 2 local processes the way torchrun does."""
    from linattn.experiments.launch import run_local

    guide = (DOCS / "guides" / "distributed.md").read_text()
    scripts = re.findall(r"```python cp_example.py\n(.*?)```", guide, re.S)
    assert len(scripts) == 1
    script = tmp_path / "cp_example.py"
    script.write_text(scripts[0])
    results = run_local([str(script)], nproc=2, deadline=120)
    assert [r.returncode for r in results] == [0, 0], [r.output for r in results]
    assert "2 ranks x 2048 tokens; final state (1, 4, 64, 64)" in results[1].output
