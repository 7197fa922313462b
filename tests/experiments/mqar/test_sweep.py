"""The MQAR sweep machinery with a stand-in model: rows, reuse, resume, table, plot, presets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from linattn import registry
from linattn.experiments.mqar import data, sweep
from linattn.experiments.mqar.data import MQARTask
from linattn.experiments.mqar.sweep import CURATED, MECHANISMS, PRESETS, Preset, run_sweep
from linattn.experiments.mqar.train import TrainConfig

from .conftest import TinyGRU

PRESET = Preset(
    name="unit",
    description="stand-in",
    task=MQARTask(vocab_size=32, seq_len=16, n_kv=2),
    train=TrainConfig(
        steps=6, batch_size=4, warmup_steps=1, eval_every=3, eval_examples=8, checkpoint_every=2
    ),  # fmt: skip
    mechanisms=("softmax", "deltanet"),
    widths=(8, 16),
    lrs=(1e-3,),
)

REQUIRED = {"mechanism", "d_model", "state_numbers", "accuracy", "seq_len", "n_kv", "steps",
            "seconds", "preset", "vocab_size", "params", "lr", "config_hash"}  # fmt: skip


def builder(mechanism: str, d_model: int, preset: Preset) -> TinyGRU:
    return TinyGRU(preset.task.vocab_size, d_model)


def meter(model: TinyGRU, seq_len: int) -> list[int]:
    # Block 0 stands for the convolution block in front (3 numbers, not the mechanism's memory);
    # block 1 for the mechanism: a GRU keeps one vector.
    return [3, model.rnn.hidden_size]


def sweep_rows(tmp_path, preset: Preset = PRESET, **kwargs) -> list[dict]:
    return run_sweep(preset, results_path=tmp_path / "r.jsonl", checkpoint_dir=tmp_path / "ck",
                     progress=False, builder=builder, meter=meter, log=lambda _: None,
                     **kwargs)  # fmt: skip


def comparable(row: dict) -> dict:
    timing = ("seconds", "cpu_seconds", "finished", "lr_sweep")
    return {k: v for k, v in row.items() if k not in timing}


def test_sweep_writes_one_row_per_mechanism_and_width(tmp_path) -> None:
    rows = sweep_rows(tmp_path, replace(PRESET, lrs=(1e-3, 3e-3)))
    assert [(r["mechanism"], r["d_model"]) for r in rows] == [
        ("softmax", 8), ("softmax", 16), ("deltanet", 8), ("deltanet", 16)
    ]  # fmt: skip
    written = sweep.read_results(tmp_path / "r.jsonl")
    assert written == json.loads(json.dumps(rows))
    for row in written:
        assert REQUIRED <= set(row)
        # the mechanism's memory only: the convolution block in front is not counted
        assert row["state_numbers"] == row["d_model"] and row["preset"] == "unit"
        assert row["state_numbers_per_block"] == [3, row["d_model"]]
        assert [x["lr"] for x in row["lr_sweep"]] == [1e-3, 3e-3]
        assert row["accuracy"] == max(x["accuracy"] for x in row["lr_sweep"])
        assert row["mixers"] == list(MECHANISMS[row["mechanism"]])


def test_rerun_reuses_finished_rows(tmp_path, monkeypatch) -> None:
    first = sweep_rows(tmp_path)

    def no_training(*args, **kwargs):
        raise AssertionError("a finished pair was trained again")

    monkeypatch.setattr(sweep, "train", no_training)
    assert sweep_rows(tmp_path) == first
    assert len(sweep.read_results(tmp_path / "r.jsonl")) == 4


def test_interrupted_sweep_resumes_to_the_same_numbers(tmp_path, monkeypatch) -> None:
    straight = sweep_rows(tmp_path / "straight")

    real_batch = data.train_batch
    calls = {"n": 0}

    def crashing_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 22:  # 6 batches per pair: the 4th pair, after its step-2 checkpoint
            raise KeyboardInterrupt
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(data, "train_batch", crashing_batch)
    with pytest.raises(KeyboardInterrupt):
        sweep_rows(tmp_path / "resumed")
    assert len(sweep.read_results(tmp_path / "resumed" / "r.jsonl")) == 3
    monkeypatch.setattr(data, "train_batch", real_batch)
    resumed = sweep_rows(tmp_path / "resumed")
    assert [comparable(r) for r in resumed] == [comparable(r) for r in straight]


def test_a_partial_last_line_names_the_results_file(tmp_path) -> None:
    sweep_rows(tmp_path)
    results = tmp_path / "r.jsonl"
    text = results.read_text()
    results.write_text(text + text.splitlines()[0][:25])  # a run killed while appending
    line = len(text.splitlines()) + 1
    with pytest.raises(ValueError, match=f"results file {results}, line {line}: not valid JSON"):
        sweep_rows(tmp_path)


def test_a_plot_path_without_suffix_is_the_file_written(tmp_path) -> None:
    path = tmp_path / "accuracy"
    assert sweep.plot_results(sweep_rows(tmp_path), path) == path
    assert path.read_bytes()[:4] == b"\x89PNG" and not path.with_suffix(".png").exists()


def test_workers_start_with_sigint_ignored() -> None:
    """The spawned workers inherit an ignored SIGINT: Ctrl-C is the main process's to handle."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    from linattn.experiments import _pool

    with _pool.sigint_ignored():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is before


def test_fresh_retrains(tmp_path) -> None:
    sweep_rows(tmp_path)
    rows = sweep_rows(tmp_path, fresh=True)
    assert len(rows) == 4 and len(sweep.read_results(tmp_path / "r.jsonl")) == 8


def test_table_and_plot(tmp_path) -> None:
    rows = sweep_rows(tmp_path)
    table = sweep.results_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[2].startswith("| softmax | 8 | 8 |")
    assert f"| {rows[3]['accuracy']:.3f} |" in lines[5]
    path = sweep.plot_results(rows, tmp_path / "plot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_hash_tracks_what_changes_results() -> None:
    h = sweep.config_hash(PRESET, "softmax", 8)
    assert h != sweep.config_hash(PRESET, "softmax", 16)
    assert h != sweep.config_hash(PRESET, "deltanet", 8)
    assert h != sweep.config_hash(replace(PRESET, lrs=(1e-3, 3e-3)), "softmax", 8)
    assert h != sweep.config_hash(replace(PRESET, task=MQARTask(32, 16, 3)), "softmax", 8)
    relaxed = replace(PRESET, train=replace(PRESET.train, checkpoint_every=5), name="other")
    assert h == sweep.config_hash(relaxed, "softmax", 8)


def test_presets_are_consistent() -> None:
    assert set(PRESETS) == {"smoke", "cpu", "zoology"}
    cpu = PRESETS["cpu"].task
    # the cpu preset runs in about 50 minutes on 2 cores over 3 seeds, 3 lrs and both fillers
    # (25 for the first nine mechanisms):
    # half the earlier T=128, 16 pairs, with the same ratios
    assert cpu.seq_len >= 64 and cpu.n_kv >= 8 and cpu.n_kv * 8 == cpu.seq_len
    assert len(PRESETS["cpu"].seeds) >= 3 and len(PRESETS["cpu"].lrs) >= 3
    assert set(PRESETS["cpu"].fillers) == {"blank", "random"}
    assert not PRESETS["cpu"].mechanism_steps and not PRESETS["cpu"].mechanism_lrs  # equal budgets
    zoo = PRESETS["zoology"]
    assert zoo.task.vocab_size == 8192 and max(zoo.widths) == 512 and len(zoo.lrs) > 1
    for preset in PRESETS.values():
        assert set(preset.mechanisms) == set(CURATED)
    # every other registered mixer may be named, in the same model
    assert set(registry.mixers()) <= set(MECHANISMS) and set(CURATED) <= set(MECHANISMS)
    assert MECHANISMS["hybrid"] == ("conv", "softmax", "kda", "kda", "kda")
    # Zoology's MQAR model: a gated convolution block in front, then the mechanism; blocks
    # without MLPs or output gates; fillers without keys (so no key is rewritten before its query)
    assert all(mixers[0] == "conv" and "conv" not in mixers[1:] for mixers in MECHANISMS.values())
    for name in ("cpu", "zoology"):
        options = PRESETS[name].model_options
        assert options["mlp"] is False and options["output_gate"] is False
    assert PRESETS["cpu"].task.random_non_queries is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(mechanisms=("mamba",)), "unknown mechanism"),
        (dict(widths=(15,)), "not divisible by n_heads"),
        (dict(widths=()), "at least one"),
        (dict(lrs=(0.0,)), "lrs must be"),
        (dict(mechanism_lrs={"softmax": (float("nan"),)}), "lrs must be"),
        (dict(mechanism_lrs={"mamba": (1e-3,)}), "unknown mechanism"),
        (dict(mechanism_steps={"mamba": 10}), "unknown mechanism"),
        (dict(mechanism_steps={"kda": 0}), r"mechanism_steps\['kda'\] must be"),
        (dict(mechanism_steps={"kda": 2.5}), r"mechanism_steps\['kda'\] must be"),
        (dict(workers=0), "workers must be"),
    ],
)
def test_bad_presets(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(PRESET, **kwargs)


def test_stand_in_builder_is_seeded_per_run(tmp_path) -> None:
    """Each run starts from the same initialisation (seeded right before building)."""
    seen = []

    def recording_builder(mechanism, d_model, preset):
        model = builder(mechanism, d_model, preset)
        seen.append(model.embed.weight.detach().clone())
        return model

    preset = replace(PRESET, widths=(8,), lrs=(1e-3, 3e-3))
    run_sweep(preset, results_path=tmp_path / "r.jsonl", checkpoint_dir=None,
              progress=False, builder=recording_builder, meter=meter,
              log=lambda _: None)  # fmt: skip
    assert len(seen) == 4 and all(torch.equal(seen[0], w) for w in seen)


def test_workers_give_the_rows_of_a_serial_sweep(tmp_path) -> None:
    """Two worker processes, one thread each: the same numbers as the pairs run one by one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = sweep_rows(tmp_path / "serial")
    finally:
        torch.set_num_threads(threads)
    parallel = sweep_rows(tmp_path / "parallel", workers=2)
    assert [comparable(r) for r in parallel] == [comparable(r) for r in serial]
    written = sweep.read_results(tmp_path / "parallel" / "r.jsonl")
    assert sorted((r["mechanism"], r["d_model"]) for r in written) == sorted(
        (r["mechanism"], r["d_model"]) for r in serial
    )
    assert sweep_rows(tmp_path / "parallel", workers=2) == parallel  # reused, not retrained


def test_mechanism_lrs_replace_the_preset_lrs_for_that_mechanism(tmp_path) -> None:
    preset = replace(PRESET, lrs=(1e-3,), mechanism_lrs={"deltanet": (3e-3, 1e-2)})
    assert preset.lrs_for("softmax") == (1e-3,) and preset.lrs_for("deltanet") == (3e-3, 1e-2)
    rows = {r["mechanism"]: r for r in sweep_rows(tmp_path, preset, workers=1)}
    assert [x["lr"] for x in rows["softmax"]["lr_sweep"]] == [1e-3]
    assert [x["lr"] for x in rows["deltanet"]["lr_sweep"]] == [3e-3, 1e-2]
    assert sweep.config_hash(preset, "deltanet", 8) != sweep.config_hash(PRESET, "deltanet", 8)
    assert sweep.config_hash(preset, "softmax", 8) == sweep.config_hash(PRESET, "softmax", 8)


def test_mechanism_steps_replace_the_preset_steps_for_that_mechanism(tmp_path) -> None:
    preset = replace(PRESET, mechanism_steps={"deltanet": 4})
    assert preset.train_for("softmax") == PRESET.train
    assert preset.train_for("deltanet") == replace(PRESET.train, steps=4)
    rows = {r["mechanism"]: r for r in sweep_rows(tmp_path, preset, workers=1)}
    assert rows["softmax"]["max_steps"] == rows["softmax"]["steps"] == 6
    assert rows["deltanet"]["max_steps"] == rows["deltanet"]["steps"] == 4
    assert [e["step"] for e in rows["deltanet"]["evals"]][-1] == 4
    assert sweep.config_hash(preset, "deltanet", 8) != sweep.config_hash(PRESET, "deltanet", 8)
    assert sweep.config_hash(preset, "softmax", 8) == sweep.config_hash(PRESET, "softmax", 8)


def test_a_row_of_another_model_is_trained_again(tmp_path) -> None:
    """A row whose parameter count is not today's model's (a layer's definition changed under the
    same configuration) is not reused: the pair is trained again and a new row appended."""
    preset = replace(PRESET, mechanisms=("softmax",), widths=(8,))
    first = sweep_rows(tmp_path, preset, workers=1)
    path = tmp_path / "r.jsonl"
    rows = sweep.read_results(path)
    rows[0]["params"] += 1  # as if trained on another layer
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = sweep_rows(tmp_path, preset, workers=1)
    assert [comparable(r) for r in again] == [comparable(r) for r in first]
    assert len(sweep.read_results(path)) == 2  # the stale row and the new one
