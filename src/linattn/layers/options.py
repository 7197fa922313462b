"""The keywords a language model's configuration (``linattn.models.LMConfig``) gives a layer:
here, below the models, so that a layer's ``from_config`` and ``linattn.models.build_mixer`` read
them alike while imports flow from the models to the layers only."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


def chunk_option(c: LMConfig) -> dict:
    """The chunk size where the config sets one (None: the layer's own default)."""
    return {} if c.chunk_size is None else {"chunk_size": c.chunk_size}


def recurrent_options(c: LMConfig) -> dict:
    """The keywords of a recurrent mixer (``linattn.layers.RecurrentMixer``) that the config
    sets: ``head_dim``, ``conv_size``, ``norm_eps``, and ``chunk_size``, ``short_conv``,
    ``output_gate`` where they are not None (None: the layer's own default)."""
    kwargs = dict(head_dim=c.head_size, conv_size=c.conv_size, **chunk_option(c))
    kwargs["norm_eps"] = c.norm_eps
    # None: the layer's own default (its paper's and fla's), not one value for every mixer.
    for name in ("short_conv", "output_gate"):
        if getattr(c, name) is not None:
            kwargs[name] = getattr(c, name)
    return kwargs


def delta_options(c: LMConfig) -> dict:
    """``recurrent_options`` and the delta rule's: ``allow_neg_eigval``, and ``dt_init_range``
    where the config sets it."""
    return dict(recurrent_options(c), allow_neg_eigval=c.allow_neg_eigval, **dt_options(c))


def dt_options(c: LMConfig) -> dict:
    """The decays' initial step sizes where the config sets them (else the layer's own)."""
    return {} if c.dt_init_range is None else {"dt_init_range": c.dt_init_range}
