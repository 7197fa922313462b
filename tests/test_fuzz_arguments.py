"""``benchmarks/fuzz_arguments.py``: every invalid argument it throws at the new rules' entry
points gets a clear error naming it, and packed sequences with empty pieces run."""

import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_every_invalid_argument_is_refused_by_name(capsys):
    spec = importlib.util.spec_from_file_location(
        "fuzz_arguments", BENCHMARKS / "fuzz_arguments.py"
    )
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    code = fuzz.main(["--seeds", "1"])
    out = capsys.readouterr().out
    assert "wrong-name 0, internal 0, accepted 0" in out, out
    assert "refused 0, wrong 0" in out, out
    assert code == 0


def test_the_fuzz_tells_a_name_from_an_article():
    spec = importlib.util.spec_from_file_location(
        "fuzz_arguments", BENCHMARKS / "fuzz_arguments.py"
    )
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    assert fuzz._names_it("a must be a torch.Tensor, got list", "a")
    assert fuzz._names_it("q, k, v must share one dtype", "k")
    assert not fuzz._names_it("b must be a torch.Tensor, got NoneType", "a")
    assert not fuzz._names_it("q contains non-finite values (NaN or Inf)", "r")
    assert not fuzz._names_it("g is a log-decay and must be <= 0", "w")
