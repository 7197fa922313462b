"""The appendix's numbers files: the macro names and formats of the spec's appendix, exactly."""

import numpy as np
import pytest

from linattn.figures import numbers
from linattn.reference import attention_maps


def appendix_attention_maps_macros() -> list[str]:
    """The macros of the spec appendix's ``write_numbers`` for P4, A4, written out independently
    of linattn.figures.numbers (NumPy only) from the spec's P4, A4."""
    P4, A4 = attention_maps(np.random.default_rng(1))
    lines = [r"\def\MapN{16}", r"\def\MapD{4}", r"\def\MapScale{1.5}", r"\def\MapUniform{0.0625}"]
    for name, M in (("Softmax", P4), ("Linear", A4)):
        sv = np.linalg.svd(M, compute_uv=False)
        nonzero = sv[sv > 1e-12]
        weights = ", ".join(f"{i}/{j}/{M[i, j]:.4f}" for i in range(16) for j in range(16))
        logs = ", ".join(f"{i}/{np.log10(s):.3f}" for i, s in enumerate(nonzero))
        lines += [
            "\\def\\" + name + "Weights{" + weights + "}",
            "\\def\\" + name + "LogSingular{" + logs + "}",
            "\\def\\" + name + "Zeros{" + str(len(sv) - len(nonzero)) + "}",
            "\\def\\" + name + "Rank{" + str(np.linalg.matrix_rank(M)) + "}",
            "\\def\\" + name + "MaxWeight{" + f"{M.max(axis=1).mean():.2f}" + "}",
        ]
    return lines


def macros(text: str) -> list[str]:
    """The \\def lines of a numbers file (the first line is a comment)."""
    lines = text.splitlines()
    assert lines[0].startswith("%")
    return lines[1:]


def test_attention_maps_numbers_match_the_appendix_macro_by_macro():
    got, want = macros(numbers.attention_maps_numbers()), appendix_attention_maps_macros()
    assert [line.split("{")[0] for line in got] == [line.split("{")[0] for line in want]
    for got_line, want_line in zip(got, want, strict=True):
        assert got_line == want_line


def test_attention_maps_numbers_carry_the_spec_values():
    text = numbers.attention_maps_numbers()
    for line in (
        r"\def\MapN{16}",
        r"\def\MapD{4}",
        r"\def\MapScale{1.5}",
        r"\def\MapUniform{0.0625}",
        r"\def\SoftmaxRank{16}",
        r"\def\LinearRank{4}",
        r"\def\SoftmaxZeros{0}",
        r"\def\LinearZeros{12}",
        r"\def\SoftmaxMaxWeight{0.39}",  # section 6.2: "averages 0.39"
        r"\def\LinearMaxWeight{0.10}",  # "and 0.10 under the feature kernel"
    ):
        assert line in text.splitlines()


def test_weights_macro_format():
    line = next(x for x in numbers.attention_maps_numbers().splitlines() if "SoftmaxWeights" in x)
    entries = line[len(r"\def\SoftmaxWeights{") : -1].split(", ")
    assert len(entries) == 256
    assert entries[0].startswith("0/0/0.") and entries[-1].startswith("15/15/0.")
    for entry in entries:
        i, j, w = entry.split("/")
        assert 0 <= int(i) < 16 and 0 <= int(j) < 16 and len(w.split(".")[1]) == 4


def test_memory_numbers_are_the_spec_lines():
    assert macros(numbers.memory_numbers()) == [
        r"\def\HeadDim{128}",
        r"\def\Tokens{131{,}072}",
        r"\def\CacheNumbers{33{,}554{,}432}",
        r"\def\StateNumbers{16{,}512}",
        r"\def\CacheRatio{2{,}032}",
        r"\def\BreakEven{64}",
    ]


@pytest.mark.parametrize("x, text", [(7, "7"), (1000, "1{,}000"), (131072, "131{,}072")])
def test_group(x, text):
    assert numbers.group(x) == text


def test_write_numbers(tmp_path):
    paths = numbers.write_numbers(tmp_path / "numbers")
    assert [p.name for p in paths] == ["attention-maps-numbers.tex", "memory-numbers.tex"]
    assert paths[0].read_text() == numbers.attention_maps_numbers()
    assert paths[1].read_text() == numbers.memory_numbers()
