"""`linattn table1`: the spec's Table 1, recomputed by its procedure, to three decimals."""

import pytest

from linattn.experiments.table1 import compute_table1, table1_markdown

# Table 1 as the spec prints it: n, additive, theory, delta (all), delta (8 newest), LS, theory.
SPEC_TABLE1 = [
    (8, 0.473, 0.468, 0.360, 0.360, 0.000, 0.000),
    (16, 0.681, 0.685, 0.537, 0.383, 0.000, 0.000),
    (32, 0.986, 0.984, 0.771, 0.414, 0.000, 0.000),
    (64, 1.403, 1.403, 1.030, 0.434, 0.707, 0.707),
    (128, 1.990, 1.992, 1.224, 0.447, 0.867, 0.866),
]
KEYS = (
    "additive",
    "additive_theory",
    "delta_all",
    "delta_newest",
    "least_squares",
    "least_squares_theory",
)


@pytest.fixture(scope="module")
def rows():
    return compute_table1()  # the spec's procedure, in full: about a second


def test_every_cell_equals_the_spec_to_three_decimals(rows):
    assert [row["n"] for row in rows] == [spec[0] for spec in SPEC_TABLE1]
    for row, spec in zip(rows, SPEC_TABLE1, strict=True):
        for key, want in zip(KEYS, spec[1:], strict=True):
            assert f"{row[key]:.3f}" == f"{want:.3f}", (row["n"], key)


def test_markdown_layout(rows):
    lines = table1_markdown(rows).splitlines()
    assert lines[0].startswith("**Table 1. Root-mean-square read error of four memories")
    assert lines[2] == (
        "| Pairs stored $n$ | Additive | Theory | Delta, all pairs | Delta, 8 newest "
        "| Least squares | Theory | MesaNet, $\\lambda = 1$ |"
    )
    # the spec's columns, then MesaNet's
    assert (
        lines[4]
        == f"| 8 | 0.473 | 0.468 | 0.360 | 0.360 | 0.000 | 0.000 | {rows[0]['mesanet']:.3f} |"
    )
    assert lines[-1] == (
        f"| 128 | 1.990 | 1.992 | 1.224 | 0.447 | 0.867 | 0.866 | {rows[-1]['mesanet']:.3f} |"
    )


def test_the_mesanet_column_is_never_below_least_squares(rows):
    # no memory reads the stored pairs back better than least squares (section 7.3); the ridge
    # costs most where least squares is exact (n <= r)
    for row in rows:
        assert row["mesanet"] >= row["least_squares"] - 1e-12
    assert rows[0]["mesanet"] > 0.1 > rows[0]["least_squares"]


def test_options_change_the_procedure():
    small = compute_table1(r=8, ns=(4, 16), repetitions=5, seed=3)
    assert [row["n"] for row in small] == [4, 16]
    assert small[0]["least_squares"] < 1e-12 and small[1]["least_squares"] > 0.5
    assert compute_table1(r=8, ns=(4,), repetitions=5, seed=4)[0] != small[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ns": ()}, "ns must be a non-empty sequence"),
        ({"ns": "8,16"}, "ns must be a non-empty sequence"),
        ({"ns": (8, 0)}, "ns must be an integer >= 1"),
        ({"repetitions": 0}, "repetitions must be an integer >= 1"),
        ({"r": -2}, "r must be an integer >= 1"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_table1(**kwargs)
