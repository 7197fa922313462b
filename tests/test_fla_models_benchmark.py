"""``benchmarks/fla_models.py``: the census of fla's model families under ``enable()``
runs on two families and records a failure with its type, message and deepest frame; a family
that decodes with an attention mask and one without a KV cache."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# fla itself is imported only when the test runs (enable()), not at collection: tests that
# import tests.fla_interpreter need fla unimported until then
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla is not installed"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning"),
]


def load():
    path = ROOT / "benchmarks" / "fla_models.py"
    spec = importlib.util.spec_from_file_location("fla_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_census_runs_two_families_and_writes_json(tmp_path, capsys):
    census = load()
    out = tmp_path / "fla-models.json"
    rows = census.main(["--families", "gla,mamba2", "--out", str(out)])
    assert json.loads(out.read_text()) == rows
    assert [r["family"] for r in rows] == ["gla", "mamba2"]
    for row in rows:
        assert row["status"] == "runs", row
        assert 0 <= row["decode_error"] <= census.TOL
    printed = capsys.readouterr().out
    assert "| gla | runs" in printed and "2 of 2 families run." in printed


def test_the_census_finds_every_config_class_and_records_a_failure(monkeypatch):
    census = load()
    import fla.models
    from transformers import PretrainedConfig

    configs = {
        c.model_type
        for c in vars(fla.models).values()
        if isinstance(c, type) and issubclass(c, PretrainedConfig)
    }
    assert set(census.families()) == configs and len(configs) >= 40

    def broken(model, ids, *args, **kwargs):
        from linattn.integrations.fla import causal_conv1d

        causal_conv1d(ids.float(), None, cp_context=object())  # raises NotImplementedError

    monkeypatch.setattr(census, "check_generate", broken)
    from linattn.integrations import fla as linattn_fla

    linattn_fla.enable()
    try:
        row = census.census("gla")
    finally:
        linattn_fla.disable()
    assert row["status"] == "fails" and row["step"] == "generate"
    assert row["error"] == "NotImplementedError" and "cp_context" in row["message"]
    assert row["frame"].startswith("linattn/integrations/fla.py:")
    assert row["frame"].endswith("in causal_conv1d")


def test_the_census_decodes_a_masked_family_and_checks_prefixes_without_a_cache(capsys):
    """FoX decodes only with an attention mask (a left-padded generate, the masked decode);
    stick-breaking attention has no KV cache (generate without one, the prefix check)."""
    census = load()
    assert "forgetting_transformer" in census.MASKED_DECODING
    assert "stickbreaking_attn" in census.NO_CACHE
    rows = census.main(["--families", "forgetting_transformer,stickbreaking_attn"])
    fox, sb = rows
    assert fox["status"] == "runs" and 0 <= fox["decode_error"] <= census.TOL, fox
    assert sb["status"] == "runs" and "decode_error" not in sb, sb
    assert 0 <= sb["prefix_error"] <= census.TOL
    printed = capsys.readouterr().out
    assert "| stickbreaking_attn | runs without a KV cache (prefix" in printed
    assert "2 of 2 families run. 1 of them without a KV cache" in printed
    assert "- forgetting_transformer: generates from a left-padded batch" in printed
