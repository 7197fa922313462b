"""The README's quick start and CI agree: `.ci/run` runs exactly the README's test command."""

import re
from pathlib import Path

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
