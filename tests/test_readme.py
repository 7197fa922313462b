"""The README's quick start and CI agree: `.ci/run` runs exactly the README's test command."""

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
    assert len(python_examples()) >= 2


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_readme_python_example_runs(index, tmp_path, monkeypatch):
    """Each example runs as printed, in an empty folder (it may write files there)."""
    example = python_examples()[index]
    if "from transformers import" in example:
        pytest.importorskip("transformers")  # the linattn[integrations] extra
    if "from fla" in example:
        pytest.importorskip("fla")  # the linattn[integrations] extra
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(example, f"README.md example {index}", "exec"), {})


def test_readme_context_parallel_script_runs_on_two_processes(tmp_path):
    """The README's `cp_example.py`, launched as 2 local processes the way torchrun does."""
    from linattn.experiments.launch import run_local

    readme = (ROOT / "README.md").read_text()
    scripts = re.findall(r"```python cp_example.py\n(.*?)```", readme, re.S)
    assert len(scripts) == 1
    script = tmp_path / "cp_example.py"
    script.write_text(scripts[0])
    results = run_local([str(script)], nproc=2, deadline=120)
    assert [r.returncode for r in results] == [0, 0], [r.output for r in results]
    assert "2 ranks x 2048 tokens; final state (1, 4, 64, 64)" in results[1].output
