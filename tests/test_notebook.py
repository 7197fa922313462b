"""The notebook (a jupytext percent script) runs as a script and prints the spec's checks."""

import contextlib
import io
import runpy
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "attention_as_matrix_algebra.py"


def test_the_notebook_runs_and_every_check_passes():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(NOTEBOOK), run_name="__main__")
    text = out.getvalue()
    assert text.rstrip().endswith("every check of this notebook passed")
    assert "FAIL" not in text
    for line in (
        "log-linear Mamba-2, one level = Mamba-2 (chunk)",
        "FoX with log f = 0 (chunk form) is softmax attention",
        "causal softmax: each row sums to one",
        "chunks of C = 64 equal the masked product",
        "Figure 6: delta-rule S_3",
        "WY form: the product of 6 transitions is I - K^T T K",
        " softmax: rank 16, mean of the largest weight in a row 0.39",
        "| 128 | 1.990 | 1.992 | 1.224 | 0.447 | 0.867 | 0.866 |",  # Table 1, the spec's last row
        "d = 1, n = 6: determinant 5.09e-13, condition number 1.28e+05",
        "relative standard error of the estimate: 0.0063",
        "24 pairs swept 200 times: the reads converge",
        "the PyTorch delta rule, chunk form, equals the reference",
        "autograd's gradient equals k (S^T k - v)^T",
        "Kimi Delta Attention: the chunk op equals the recurrence",
        "hybrid model: prefill then one step equals one pass",
        "memory-numbers.tex: 7 lines",
        "parity over 10,000 tokens: the state's sign",
        "S_5: 4 reflections a token read the running product",
    ):
        assert line in text, line
    # Sections 2 to 10 in order, and the nine figures, each after the text it illustrates.
    figures = [text.index(f"Figure {n}. ") for n in range(1, 10)]
    assert figures == sorted(figures)
    assert text.count(" PASS") == 87 and "FAIL" not in text


def test_the_notebook_tells_sections_2_to_10():
    headings = [line for line in NOTEBOOK.read_text().splitlines() if line.startswith("# ## ")]
    numbers = [heading.split()[2].rstrip(".") for heading in headings]
    assert numbers[:9] == ["2", "3", "4", "5", "6", "7", "8", "9", "10"]
    assert numbers[9:11] == ["11", "12"]  # state tracking; beyond a fixed memory


def test_the_notebook_is_a_jupytext_percent_script():
    jupytext = pytest.importorskip("jupytext")
    notebook = jupytext.read(NOTEBOOK)
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds.count("markdown") >= 8 and kinds.count("code") >= 8
    assert notebook.cells[0].cell_type == "markdown"
