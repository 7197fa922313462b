"""``CausalLM``: a small causal language model whose blocks use any mixer, hybrids included.

    ids -> embedding -> [x + mixer(norm(x)); x + swiglu(norm(x))] x n_layers -> norm -> head

Generation keeps one fixed-size state per recurrent block and a KV cache per softmax block
(``new_cache``); ``model(ids, cache=cache)`` runs the new tokens and advances the cache, so a prompt
can be fed whole (chunk mode), in pieces of any lengths, or one token at a time (recurrent mode)
with the same logits.
"""

from __future__ import annotations

import math
import numbers
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers.mixer import State, TokenMixer
from linattn.models.cache import Cache
from linattn.models.config import LMConfig
from linattn.models.mixers import build_mixer


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)`` (Shazeer, 2020), hidden width ``config.mlp_hidden``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: ``x + mixer(norm(x))``, then ``x + mlp(norm(x))`` (unless
    ``config.mlp`` is False: then the mixer alone)."""

    def __init__(self, config: LMConfig, mixer: str, index: int | None = None) -> None:
        super().__init__()
        self.mixer_name = mixer
        self.norm1 = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mixer: TokenMixer = build_mixer(mixer, config, index)
        self.norm2 = self.mlp = None
        if config.mlp:
            self.norm2 = nn.RMSNorm(config.d_model, eps=config.norm_eps)
            self.mlp = SwiGLU(config.d_model, config.mlp_hidden)

    def forward(
        self, x: Tensor, state: State | None = None, shared: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, State | None]:
        """``shared``: the values the blocks of one forward pass pass along (RWKV-7's v_first)."""
        h, state = self.mixer(self.norm1(x), state, shared)
        x = x + h
        if self.mlp is None:
            return x, state
        return x + self.mlp(self.norm2(x)), state


class CausalLM(nn.Module):
    """A causal LM of ``config.n_layers`` blocks with mixers ``config.mixers``.

    ``model(input_ids)`` -> logits ``[B, T, vocab_size]``; with ``cache=model.new_cache(B)`` the
    cache is advanced in place (see ``generate``).
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
        self.config = config
        # The hash of the configuration the blocks were built from, once: a cache check on every
        # decoding step reads it (and torch.compile cannot trace the json encoder that makes it).
        self.fingerprint = config.fingerprint()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, name, i) for i, name in enumerate(config.mixers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        """Normal(0, init_std) for every linear and embedding weight, zero biases. The gate
        parameters (``A_log``, ``dt_bias``) keep the initialisation their layers gave them, and so
        does the short convolution; a layer whose gates live in a linear's bias sets them again
        afterwards by its ``init_gates()`` (FoX's forget gates)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for module in self.modules():
            init_gates = getattr(module, "init_gates", None)
            if callable(init_gates):
                init_gates()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    # -- cache --------------------------------------------------------------------------------

    def new_cache(self, batch_size: int, device: torch.device | str | None = None) -> Cache:
        """An empty generation cache for ``batch_size`` sequences, in the model's dtype (states in
        float32, or float64 for a float64 model), on ``device`` (default: the model's)."""
        _check_int("batch_size", batch_size, 0)
        device = self.device if device is None else device
        blocks = [b.mixer.new_state(batch_size, self.dtype, device) for b in self.blocks]
        growing = [b.mixer.growing for b in self.blocks]
        return Cache(blocks, growing, self.fingerprint, batch_size)

    def _check_cache(self, cache: Cache, batch_size: int) -> None:
        if not isinstance(cache, Cache):
            raise TypeError(f"cache must be a linattn.models.Cache, got {type(cache).__name__}")
        if cache.fingerprint != self.fingerprint or len(cache) != len(self.blocks):
            raise ValueError(
                f"cache was made for another model (config fingerprint {cache.fingerprint}, "
                f"{len(cache)} blocks; this model: {self.fingerprint}, "
                f"{len(self.blocks)} blocks)"
            )
        if cache.batch_size != batch_size:
            raise ValueError(
                f"cache holds batch size {cache.batch_size}, "
                f"but input_ids has batch size {batch_size}"
            )
        for i, (block, state) in enumerate(zip(self.blocks, cache.blocks, strict=True)):
            try:
                block.mixer.check_state(state, batch_size, self.dtype)
            except ValueError as error:
                raise ValueError(f"cache block {i} ({block.mixer_name}): {error}") from None

    # -- forward ------------------------------------------------------------------------------

    def _check_ids(self, input_ids: Tensor) -> None:
        if not isinstance(input_ids, Tensor):
            raise TypeError(f"input_ids must be a tensor, got {type(input_ids).__name__}")
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(
                f"input_ids must have shape [B, T] with T >= 1, got {tuple(input_ids.shape)}"
            )
        if input_ids.numel() == 0:  # B = 0: empty logits [0, T, vocab_size], as nn.Embedding
            return
        if torch.compiler.is_compiling():  # values unknown while tracing: checked in the graph
            inside = (input_ids >= 0) & (input_ids < self.config.vocab_size)
            torch._assert_async(inside.all(), "input_ids holds a token id outside the vocabulary")
            return
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"input_ids holds token id {bad}, "
                f"outside the vocabulary [0, {self.config.vocab_size})"
            )

    def _check_context(self, cached: int, new: int, later: int = 0) -> None:
        """The context (cached + new tokens, + ``later`` ones still to be fed) fits max_seq_len."""
        limit = self.config.max_seq_len
        total = cached + new + later
        if limit is not None and total > limit:
            later_text = f" + {later} generated" if later else ""
            raise ValueError(
                f"context of {total} tokens ({cached} cached + {new} new{later_text}) "
                f"exceeds max_seq_len = {limit}"
            )

    def forward(self, input_ids: Tensor, cache: Cache | None = None) -> Tensor:
        """input_ids: [B, T] -> logits [B, T, vocab_size]; advances ``cache`` by T tokens.

        A refused or failed call leaves the cache as it was: the checks run before any work, and
        the blocks' new states (new tensors: no block updates its state in place) are committed
        to the cache together with the position only after the last block has run, so that an
        error inside block i (a NaN in its state, an interrupt) cannot leave blocks 0..i-1
        advanced."""
        self._check_ids(input_ids)
        if cache is not None:
            self._check_cache(cache, input_ids.shape[0])
        self._check_context(0 if cache is None else cache.position, input_ids.shape[1])
        x = self.embed(input_ids.long())  # [B, T, d_model]
        states = []
        shared: dict[str, Tensor] = {}  # what a block leaves for the later ones (RWKV-7's v_first)
        for i, block in enumerate(self.blocks):
            x, state = block(x, None if cache is None else cache.blocks[i], shared)
            states.append(state)
        if cache is not None:
            cache.blocks[:] = states
            cache.position += input_ids.shape[1]
        return self.lm_head(self.norm(x))

    # -- generation ---------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
        *,
        cache: Cache | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Prefill ``input_ids`` [B, T] (chunk mode), then sample ``max_new_tokens`` one at a time
        (recurrent mode). Returns ``[B, T + max_new_tokens]``: the prompt and the new tokens.

        ``temperature = 0`` picks the most likely token; ``top_k`` samples among the k most likely.
        ``seed`` seeds a fresh generator; pass ``generator`` instead to continue a random stream.
        With ``cache``, ``input_ids`` continues the cached context, and the cache is advanced in
        place: afterwards it holds every token but the last one returned (which the next call
        should feed first), so that generation can be saved (``cache.save``) and resumed.
        """
        _check_int("max_new_tokens", max_new_tokens, 0)
        if top_k is not None:
            _check_int("top_k", top_k, 1)
        _check_temperature(temperature)
        _check_seed(seed)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self._check_ids(input_ids)
        if cache is None:
            cache = self.new_cache(input_ids.shape[0])
        self._check_cache(cache, input_ids.shape[0])
        # The whole context before any work: the prompt, then every sampled token but the last.
        self._check_context(cache.position, input_ids.shape[1], max(max_new_tokens - 1, 0))
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(int(seed))
        logits = self(input_ids, cache=cache)[:, -1]  # [B, vocab]
        out = [input_ids.long()]
        for step in range(max_new_tokens):
            token = sample(logits, temperature, top_k, generator)  # [B, 1]
            out.append(token)
            if step + 1 < max_new_tokens:
                logits = self(token, cache=cache)[:, -1]
        return torch.cat(out, dim=1)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_temperature(temperature: object) -> None:
    """0 (greedy) or a positive real whose reciprocal is finite in float64.

    The logits are divided by the temperature: below 1 / float64-max (about 5.6e-309; 1e-320, a
    subnormal, for one) the quotient is infinite and the softmax NaN, so such a value is refused
    here rather than failing inside torch.multinomial.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number, got {type(temperature).__name__}")
    temperature = float(temperature)
    if temperature == 0:
        return
    if not (temperature > 0 and math.isfinite(temperature) and math.isfinite(1 / temperature)):
        raise ValueError(
            f"temperature must be 0 (greedy) or a finite number >= {1 / sys.float_info.max:.3g} "
            f"(1 / temperature must be finite), got {temperature!r}"
        )


def _check_seed(seed: object) -> None:
    """None or an integer in [0, 2**64) (what torch.Generator.manual_seed takes), not a bool."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be None or an int, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must lie in [0, 2**64), got {seed}")


def sample(
    logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> Tensor:
    """One token per row of logits [B, vocab] -> [B, 1]: greedy at temperature 0, else a draw from
    softmax(logits / temperature), restricted to the ``top_k`` largest when given."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # float64: the draw does not depend on the model dtype. The largest logit is subtracted first
    # so that the largest quotient is exactly 0 and a tiny temperature gives -inf (probability 0)
    # to the others, never inf - inf = NaN.
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
