"""The generation cache: fixed size for recurrent blocks, growth only by the KV cache, accounting,
save / load."""

from __future__ import annotations

import pytest
import torch

from linattn.models import ATTENTION_MIXERS, MIXERS, Cache, CausalLM
from tests.models.tiny import HYBRID, tiny_config

RECURRENT = tuple(m for m in MIXERS if m not in ATTENTION_MIXERS)


def run_tokens(model: CausalLM, cache: Cache, n: int, piece: int = 2000) -> None:
    ids = torch.randint(0, 37, (cache.batch_size, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for start in range(0, n, piece):
            model(ids[:, start : start + piece], cache=cache)


def test_recurrent_cache_has_the_same_size_at_10_and_10000_tokens():
    model = CausalLM(tiny_config(RECURRENT, max_seq_len=None, chunk_size=64))
    cache = model.new_cache(1)
    empty = cache.nbytes()
    run_tokens(model, cache, 10)
    at_10 = cache.nbytes()
    run_tokens(model, cache, 9990)
    assert cache.position == 10_000
    assert cache.nbytes() == at_10 == empty
    assert cache.nbytes_at(10) == cache.nbytes_at(10_000) == at_10


def test_hybrid_cache_grows_only_by_the_softmax_kv_cache():
    model = CausalLM(tiny_config(HYBRID, max_seq_len=None))
    cache = model.new_cache(1)
    run_tokens(model, cache, 10)
    blocks_10 = cache.nbytes_per_block()
    run_tokens(model, cache, 990)
    blocks_1000 = cache.nbytes_per_block()
    assert blocks_1000[:3] == blocks_10[:3]  # the KDA blocks
    # One softmax block: keys and values, 2 heads of 16 float32 numbers, per token.
    assert blocks_1000[3] - blocks_10[3] == 990 * 2 * 2 * 16 * 4
    assert cache.nbytes_per_block_at(10) == blocks_10
    assert cache.nbytes_at(1000) == cache.nbytes()


def test_numbers_per_block_match_the_layouts():
    H, D, kernel = 2, 16, 4
    model = CausalLM(tiny_config(("deltanet", "linear", "taylor", "softmax")))
    cache = model.new_cache(3)
    run_tokens(model, cache, 5)
    conv = (kernel - 1) * H * (2 * D + D)  # last 3 inputs of q, k and v
    taylor_conv = (kernel - 1) * H * (2 * 4 + D)  # taylor_dim = 4 in the tiny config
    taylor_features = 1 + 4 + 16
    assert cache.numbers_per_block() == [
        3 * (H * D * D + conv),  # delta rule: S is K x V
        3 * (H * D * (D + 1) + conv),  # normalised: one more column, z
        3 * (H * taylor_features * (D + 1) + taylor_conv),
        3 * 2 * 5 * H * D,  # softmax after 5 tokens: keys and values
    ]


def test_softmax_short_conv_adds_a_fixed_conv_state():
    H, D, kernel = 2, 16, 4
    model = CausalLM(tiny_config(("softmax",), softmax_short_conv=True, max_seq_len=None))
    cache = model.new_cache(1)
    run_tokens(model, cache, 5)
    conv = (kernel - 1) * 3 * H * D  # last 3 inputs of q, k and v
    assert cache.numbers_per_block() == [2 * 5 * H * D + conv]
    run_tokens(model, cache, 7)
    assert cache.numbers_per_block() == [2 * 12 * H * D + conv]


def test_gated_convolution_block_keeps_its_last_inputs():
    model = CausalLM(tiny_config(("conv", "deltanet"), gated_conv_size=3))
    cache = model.new_cache(2)
    run_tokens(model, cache, 5)
    H, D, kernel = 2, 16, 4
    assert cache.numbers_per_block() == [
        2 * (3 - 1) * 32,  # the last 2 inputs of d_model = 32 channels
        2 * (H * D * D + (kernel - 1) * H * 3 * D),
    ]


def test_save_and_load_round_trip_exactly(tmp_path):
    model = CausalLM(tiny_config(HYBRID)).double()
    cache = model.new_cache(2)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids, cache=cache)
    cache.save(tmp_path / "c.pt")
    loaded = Cache.load(tmp_path / "c.pt")
    assert (loaded.position, loaded.batch_size, loaded.fingerprint) == (9, 2, cache.fingerprint)
    assert loaded.growing == cache.growing
    for a, b in zip(cache.blocks, loaded.blocks, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name])
    step = torch.randint(0, 37, (2, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(step, cache=cache), model(step, cache=loaded))


def test_load_refuses_other_files(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "w.pt")
    with pytest.raises(ValueError, match="not a linattn cache"):
        Cache.load(tmp_path / "w.pt")


def test_nbytes_at_rejects_negative_t():
    cache = CausalLM(tiny_config(("softmax",))).new_cache(1)
    with pytest.raises(ValueError, match="t must be"):
        cache.nbytes_at(-1)


def saved_cache(tmp_path, seed=1):
    model = CausalLM(tiny_config(HYBRID))
    cache = model.new_cache(1)
    ids = torch.randint(0, 37, (1, 6), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model(ids, cache=cache)
    path = tmp_path / "c.pt"
    cache.save(path)
    return cache, path


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    import errno

    from linattn.models import cache as cache_module

    good, path = saved_cache(tmp_path)
    old_bytes = path.read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # a partial write, then the disk is full
        f.seek(len(old_bytes) // 3)
        f.truncate()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module.torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        good.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == old_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]  # no temporary file left
    assert Cache.load(path).position == 6


def test_flipped_bytes_anywhere_are_refused(tmp_path):
    _, path = saved_cache(tmp_path)
    payload = path.read_bytes()
    tensor_bytes = torch.load(path, weights_only=True)["blocks"][0]["S"].numpy().tobytes()
    offset = payload.index(tensor_bytes[:64])  # inside the first block's state S
    for where in (offset, offset + len(tensor_bytes) // 2):
        flipped = bytearray(payload)
        flipped[where] ^= 0x10
        path.write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match="corrupt: its checksum does not match"):
            Cache.load(path)


@pytest.mark.parametrize("keep", [0, 100, 0.5, 0.99], ids=repr)
def test_a_truncated_file_is_refused(tmp_path, keep):
    _, path = saved_cache(tmp_path)
    payload = path.read_bytes()
    path.write_bytes(payload[: int(keep * len(payload)) if isinstance(keep, float) else keep])
    with pytest.raises(ValueError, match="c.pt"):
        Cache.load(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("fingerprint"), "no 'fingerprint'"),
        (lambda d: d.pop("checksum"), "no 'checksum'"),
        (lambda d: d.update(position="6"), "'position' must be a int"),
        (lambda d: d.update(blocks=[{"S": 3}]), "'blocks' must be dicts of tensors"),
        (lambda d: d.update(position=-1), "checksum does not match"),
    ],
)
def test_incomplete_or_altered_dicts_are_refused(tmp_path, change, message):
    cache, path = saved_cache(tmp_path)
    d = cache.to_dict()
    change(d)
    torch.save(d, path)
    with pytest.raises(ValueError, match=message):
        Cache.load(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("position", -1), ("position", 1.0), ("batch_size", -1), ("position", True)],
)
def test_cache_counts_must_be_integers_in_range(field, value):
    kwargs = dict(blocks=[], growing=[], fingerprint="x", batch_size=1, position=0)
    with pytest.raises(ValueError, match=f"{field} must be an integer >= "):
        Cache(**{**kwargs, field: value})
