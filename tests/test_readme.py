"""The README's quick start and CI agree (`.ci/run` runs exactly the README's test command), its
examples run as printed, and its links into the documentation resolve."""

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    """The shell commands of the README's quick start, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    for command in commands:
        assert "torch==2.13.0" in command, "the install must pin the CPU wheel"


def test_ci_runs_the_readme_test_command():
    test_command = quick_start_commands()[1]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def python_examples() -> list[str]:
    """Every ```python block of the README, in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_has_python_examples():
    assert len(python_examples()) >= 1


def run_example(example: str, name: str, folder: Path, monkeypatch) -> None:
    """Run one Markdown example as printed, in ``folder`` (it may write files there); an example
    that imports transformers or fla skips without the integrations extra."""
    if "from transformers import" in example or "import transformers" in example:
        pytest.importorskip("transformers")  # the linattn[integrations] extra
    if "from fla" in example or "import fla" in example:
        pytest.importorskip("fla")  # the linattn[integrations] extra
    monkeypatch.chdir(folder)
    torch.manual_seed(0)
    exec(compile(example, name, "exec"), {})


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_readme_python_example_runs(index, tmp_path, monkeypatch):
    """Each example runs as printed, in an empty folder (it may write files there)."""
    run_example(python_examples()[index], f"README.md example {index}", tmp_path, monkeypatch)


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository (the docs' pages)."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", readme)
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert local, "the README links into the documentation"
    missing = [t for t in local if not (ROOT / t).is_file()]
    assert missing == [], missing


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_readme_lists_every_registered_mechanism_with_its_forms_and_nearest():
    from linattn import registry

    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| ")]
    for entry in registry.mechanisms():
        if entry.nearest is None:
            continue  # the first table: the spec's mechanisms, each with its call
        (row,) = [r for r in rows if r.startswith(f"| {entry.title} |")]
        assert f"| {', '.join(entry.forms)} | `{entry.nearest}` |" in row, entry.name
