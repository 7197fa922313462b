"""Data-parallel MQAR training: 2 gloo processes give the loss curve of 1 process (same batches).

Tolerances. In float64 the two runs differ only in the order in which the gradient of the global
batch is summed (two half-batch sums and DDP's all-reduce, against one batched sum), i.e. by
rounding at 1e-16; 300 AdamW steps amplify that very little (we measured 4e-16 relative on the
loss). We assert 1e-9 relative: a million times the measured gap, and still far below what any
real difference (another batch split, a missing rank's rows, a wrong gradient scale under
clipping) produces, which is 1e-3 or more. In float32 the same rounding is 1e-7; we assert 1e-4.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from linattn.experiments.launch import run_local
from linattn.experiments.mqar import data_parallel


def options(steps: int, dtype: str) -> list[str]:
    """A tiny recall model: the MQAR smoke task (V=32, T=16), DeltaNet, width 16, global batch 8.

    Trained on a mixture of 1 and 2 key-value pairs: rows 0-3 of each batch hold 1 query, rows
    4-7 hold 2, so rank 0's shard has 4 queries and rank 1's has 8. A per-rank mean averaged over
    the ranks would weight them wrongly; the loss must be the global batch's mean.
    """
    return ["--preset", "smoke", "--mechanism", "deltanet", "--steps", str(steps),
            "--batch-size", "8", "--train-n-kv", "1", "2", "--dtype", dtype,
            "--no-eval"]  # fmt: skip


def one_process(steps: int, dtype: str) -> np.ndarray:
    parser = argparse.ArgumentParser()
    data_parallel.configure(parser)
    model, task, config = data_parallel.build(parser.parse_args(options(steps, dtype)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared; one thread is also what each rank uses
    try:
        result = data_parallel.train_data_parallel(model, task, config, evaluate=False)
    finally:
        torch.set_num_threads(threads)
    assert result.world_size == 1
    return np.array(result.losses)


def two_processes(steps: int, dtype: str, tmp_path, env: dict[str, str]) -> np.ndarray:
    out = tmp_path / "losses.json"
    args = ["-m", "linattn.experiments.mqar.data_parallel", *options(steps, dtype)]
    args += ["--loss-file", str(out)]
    results = run_local(args, 2, deadline=300, env=env)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank}:\n{r.output[-3000:]}"
    log = json.loads(out.read_text())
    assert log["world_size"] == 2
    return np.array(log["losses"])


def relative_gap(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.max(np.abs(a - b) / np.abs(a)))


def test_two_ranks_match_one_process_float64(tmp_path, worker_env):
    steps = 40
    single, double = (
        one_process(steps, "float64"),
        two_processes(steps, "float64", tmp_path, worker_env),
    )
    assert len(single) == steps
    assert relative_gap(double, single) < 1e-9, relative_gap(double, single)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-9), ("float32", 1e-4)])
def test_two_ranks_match_one_process_300_steps(tmp_path, worker_env, dtype, tolerance):
    steps = 300
    single, double = one_process(steps, dtype), two_processes(steps, dtype, tmp_path, worker_env)
    gap = relative_gap(double, single)
    print(f"{dtype}: max relative gap of the loss curves over {steps} steps: {gap:.2e}")
    assert gap < tolerance
    assert single[-20:].mean() < single[:20].mean()


def test_build_rejects_unknown_names():
    parser = argparse.ArgumentParser()
    data_parallel.configure(parser)
    with pytest.raises(ValueError, match="--preset"):
        data_parallel.build(parser.parse_args(["--preset", "nope"]))
    with pytest.raises(ValueError, match="--mechanism"):
        data_parallel.build(parser.parse_args(["--mechanism", "nope"]))


def test_build_takes_the_mechanisms_own_recipe_from_the_preset(monkeypatch):
    """A preset's per-mechanism lr and steps, unless the command line overrides them. (The cpu
    preset has one budget and one lr grid for all: given its own here.)"""
    from linattn.experiments.mqar.sweep import PRESETS

    cpu = PRESETS["cpu"]
    own = replace(cpu, mechanism_lrs={"softmax": (1e-2,)}, mechanism_steps={"kda": 2000})
    monkeypatch.setitem(PRESETS, "cpu", own)
    parser = argparse.ArgumentParser()
    data_parallel.configure(parser)
    _, _, config = data_parallel.build(
        parser.parse_args(["--preset", "cpu", "--mechanism", "softmax"])
    )
    assert config.lr == 1e-2 and config.steps == cpu.train.steps
    _, _, config = data_parallel.build(parser.parse_args(["--preset", "cpu", "--mechanism", "kda"]))
    # an lr sweep (several lrs) gives no single lr: the preset's training lr
    assert len(cpu.lrs) > 1 and config.lr == cpu.train.lr and config.steps == 2000
    argv = ["--preset", "cpu", "--mechanism", "kda", "--lr", "1e-3", "--steps", "7"]
    _, _, config = data_parallel.build(parser.parse_args(argv))
    assert config.lr == 1e-3 and config.steps == 7
