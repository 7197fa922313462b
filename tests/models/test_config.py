"""LMConfig: validation with clear errors, round trip, fingerprint."""

from __future__ import annotations

import pytest
import torch

from linattn.models import MIXERS, LMConfig


def test_defaults_and_derived_sizes():
    config = LMConfig(vocab_size=100)
    assert config.mixers == ("deltanet", "deltanet") and config.n_layers == 2
    assert config.head_size == 64 and config.mlp_hidden == 512
    assert LMConfig(vocab_size=10, d_model=48, n_heads=4, head_dim=8).head_size == 8


def test_mixers_become_a_tuple_and_every_name_is_accepted():
    config = LMConfig(vocab_size=10, mixers=list(MIXERS))
    assert config.mixers == MIXERS
    assert LMConfig(vocab_size=10, mixers=["conv", "kda"]).mixers == ("conv", "kda")


def test_block_options_change_the_fingerprint():
    base = LMConfig(vocab_size=10)
    for change in (dict(mlp=False), dict(output_gate=False), dict(gated_conv_size=4)):
        assert LMConfig(vocab_size=10, **change).fingerprint() != base.fingerprint(), change


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(mixers=("kda", "mamba")), r"mixers\[1\] is 'mamba', an unknown mixer"),
        (dict(mixers=()), "at least one mixer"),
        (dict(mixers="kda"), "sequence of names"),
        (dict(d_model=30, n_heads=4), r"d_model \(30\) must be divisible by n_heads \(4\)"),
        (dict(vocab_size=0), "vocab_size must be an integer >= 1"),
        (dict(n_heads=0), "n_heads must be an integer >= 1"),
        (dict(head_dim=0), "head_dim must be an integer >= 1"),
        (dict(chunk_size=0), "chunk_size must be an integer >= 1"),
        (dict(max_seq_len=0), "max_seq_len must be an integer >= 1"),
        (dict(mlp_ratio=0), "mlp_ratio must be > 0"),
        (dict(gated_conv_size=0), "gated_conv_size must be an integer >= 1"),
        (dict(dt_init_range=(1e-2, 1e-3)), "dt_init_range must be a pair"),
    ],
)
def test_bad_configs_name_the_problem(kwargs, message):
    kwargs = dict(dict(vocab_size=10), **kwargs)
    with pytest.raises(ValueError, match=message):
        LMConfig(**kwargs)


def test_dict_round_trip_and_fingerprint():
    config = LMConfig(vocab_size=10, mixers=("kda", "softmax"), d_model=32)
    assert LMConfig.from_dict(config.to_dict()) == config
    assert config.fingerprint() == LMConfig.from_dict(config.to_dict()).fingerprint()
    # Fields that shape the state change the fingerprint; the context limit does not.
    assert (
        config.fingerprint()
        != LMConfig(vocab_size=10, mixers=("kda", "kda"), d_model=32).fingerprint()
    )
    assert (
        config.fingerprint()
        == LMConfig(
            vocab_size=10, mixers=("kda", "softmax"), d_model=32, max_seq_len=99
        ).fingerprint()
    )
    with pytest.raises(ValueError, match="unknown LMConfig fields"):
        LMConfig.from_dict(dict(config.to_dict(), depth=3))


# None is short_conv's and output_gate's default (each mixer's own: the test below), not an error.
@pytest.mark.parametrize(
    ("field", "value"),
    [
        (field, value)
        for field in ("mlp", "tie_embeddings", "short_conv", "output_gate", "rope",
                      "softmax_short_conv", "allow_neg_eigval", "forget_gate")
        for value in ("no", 1, None)
        if not (value is None and field in ("short_conv", "output_gate"))
    ],
)  # fmt: skip
def test_yes_no_fields_must_be_bools(field, value):
    with pytest.raises(TypeError, match=f"LMConfig.{field} must be a bool"):
        LMConfig(vocab_size=8, d_model=8, n_heads=2, mixers=("kda",), **{field: value})


def test_the_papers_defaults_reach_the_mixers_of_those_names():
    """LMConfig leaves short_conv and output_gate to each mixer unless set: "gla" has no short
    convolution and "deltanet" no output gate (their papers' and fla's layers), the others both;
    a value set in the config applies to every recurrent mixer."""
    from linattn.models import CausalLM

    mixers = ("gla", "deltanet", "gated_deltanet", "kda")
    model = CausalLM(LMConfig(vocab_size=8, d_model=16, n_heads=2, mixers=mixers))
    layers = dict(zip(mixers, (block.mixer for block in model.blocks), strict=True))
    assert layers["gla"].conv is None and layers["gla"].g_proj is not None
    assert layers["deltanet"].conv is not None and layers["deltanet"].g_proj is None
    for name in ("gated_deltanet", "kda"):
        assert layers[name].conv is not None and layers[name].g_proj is not None
    forced = CausalLM(
        LMConfig(vocab_size=8, d_model=16, n_heads=2, mixers=mixers, short_conv=True,
                 output_gate=False)
    )  # fmt: skip
    for block in forced.blocks:
        assert block.mixer.conv is not None and block.mixer.g_proj is None


def test_the_chunk_size_is_each_mixers_own_unless_set():
    """chunk_size None (the default) leaves C to each mixer: 32 for the generalized delta rule's
    layers (dplr.CHUNK_SIZE), 64 for the others; a value set applies to all."""
    from linattn.models import CausalLM
    from linattn.ops.rules import dplr

    mixers = ("rwkv7", "comba", "gdn2", "mamba2", "kda", "linear", "mla", "conv")
    own = {"rwkv7": dplr.CHUNK_SIZE, "comba": dplr.CHUNK_SIZE, "gdn2": dplr.CHUNK_SIZE,
           "mamba2": 64, "kda": 64, "linear": 64, "mla": 64, "conv": 64}  # fmt: skip
    model = CausalLM(LMConfig(vocab_size=8, d_model=16, n_heads=2, mixers=mixers))
    assert LMConfig(vocab_size=8, d_model=16, n_heads=2).chunk_size is None
    assert {m: b.mixer.chunk_size for m, b in zip(mixers, model.blocks, strict=True)} == own
    forced = CausalLM(LMConfig(vocab_size=8, d_model=16, n_heads=2, mixers=mixers, chunk_size=16))
    assert {block.mixer.chunk_size for block in forced.blocks} == {16}


def test_forget_gate_off_builds_deltaproduct_without_its_decay():
    """forget_gate=False: the "deltaproduct" block's transition is the product of its n_h
    Householder matrices alone (no decay module, no decay parameters); on by default."""
    from linattn.models import CausalLM

    def build(**options):
        config = LMConfig(vocab_size=8, d_model=16, n_heads=2, mixers=("deltaproduct",), **options)
        return config, CausalLM(config).blocks[0].mixer

    config, gated = build()
    plain_config, plain = build(forget_gate=False)
    assert gated.use_forget_gate and gated.decay is not None
    assert not plain.use_forget_gate and plain.decay is None
    count = sum(p.numel() for p in gated.parameters()) - sum(p.numel() for p in plain.parameters())
    assert count == sum(p.numel() for p in gated.decay.parameters()) > 0
    assert config.fingerprint() != plain_config.fingerprint()


def test_numpy_bools_are_stored_as_bools():
    import numpy as np

    config = LMConfig(vocab_size=8, d_model=8, n_heads=2, mixers=("kda",), mlp=np.bool_(False))
    assert config.mlp is False
    assert config.fingerprint() == LMConfig(**{**config.to_dict(), "mlp": False}).fingerprint()


def test_dt_init_range_reaches_every_decay_and_leaves_the_fingerprint():
    # The initial step sizes of scalar_decay, Gated DeltaNet, KDA, DeltaProduct and Mamba-2.
    from linattn.models import CausalLM

    mixers = ("scalar_decay", "gated_deltanet", "kda", "deltaproduct", "mamba2")
    config = LMConfig(vocab_size=10, d_model=32, mixers=mixers, dt_init_range=[2e-4, 3e-4])
    assert config.dt_init_range == (2e-4, 3e-4)
    torch.manual_seed(0)
    dts = [
        torch.nn.functional.softplus(p)
        for name, p in CausalLM(config).named_parameters()
        if name.endswith("dt_bias")
    ]
    assert len(dts) == len(mixers)
    for dt in dts:
        assert ((dt > 1.99e-4) & (dt < 3.01e-4)).all()
    assert config.fingerprint() == LMConfig(vocab_size=10, d_model=32, mixers=mixers).fingerprint()
