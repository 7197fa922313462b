"""``Cache``: the generation state of a ``CausalLM``, one dict of tensors per block (spec 5, 9).

A recurrent block holds its memory ``S`` ([B, H, K, V], fixed size) and its short convolution's last
inputs ([B, channels, kernel - 1]); a softmax block holds its KV cache (``k``, ``v``: [B, t, H, D]),
which grows with the number t of tokens seen. ``nbytes()`` and ``numbers_per_block()`` count the
tensors held; ``nbytes_at(t)`` the bytes the same structure holds after t tokens (the growing
tensors' per-token size times t, the others as they are).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

_FORMAT = "linattn.cache/1"


class Cache:
    """Per-block state tensors, the number of tokens seen, and the fingerprint of the model config.

    Attributes:
        blocks: one ``dict[str, Tensor]`` per block.
        growing: per block, the names of the tensors whose axis 1 is time (a KV cache).
        fingerprint: ``LMConfig.fingerprint()`` of the model that made the cache.
        batch_size: number of sequences.
        position: tokens seen so far (the absolute position of the next token).
    """

    def __init__(
        self,
        blocks: list[dict[str, Tensor]],
        growing: list[tuple[str, ...]],
        fingerprint: str,
        batch_size: int,
        position: int = 0,
    ) -> None:
        if len(blocks) != len(growing):
            raise ValueError("blocks and growing must have one entry per block")
        self.blocks = blocks
        self.growing = [tuple(g) for g in growing]
        self.fingerprint = fingerprint
        self.batch_size = batch_size
        self.position = position

    def __len__(self) -> int:
        return len(self.blocks)

    def __repr__(self) -> str:
        return (
            f"Cache(blocks={len(self.blocks)}, batch_size={self.batch_size}, "
            f"position={self.position}, nbytes={self.nbytes():,})"
        )

    # -- accounting -------------------------------------------------------------------------

    def numbers_per_block(self) -> list[int]:
        """Number of stored numbers (tensor elements) of each block."""
        return [sum(t.numel() for t in block.values()) for block in self.blocks]

    def nbytes_per_block(self) -> list[int]:
        """Bytes held by each block."""
        return [sum(t.numel() * t.element_size() for t in block.values()) for block in self.blocks]

    def nbytes(self) -> int:
        """Bytes held by the whole cache."""
        return sum(self.nbytes_per_block())

    def nbytes_per_block_at(self, t: int) -> list[int]:
        """Bytes each block would hold after ``t`` tokens: a growing tensor [B, t', ...] counts
        ``B * t * prod(rest)`` elements, every other tensor its present size."""
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"t must be an integer >= 0, got {t!r}")
        sizes = []
        for block, growing in zip(self.blocks, self.growing, strict=True):
            total = 0
            for name, tensor in block.items():
                shape = list(tensor.shape)
                if name in growing:
                    shape[1] = t
                total += math.prod(shape) * tensor.element_size()
            sizes.append(total)
        return sizes

    def nbytes_at(self, t: int) -> int:
        """Bytes the whole cache would hold after ``t`` tokens."""
        return sum(self.nbytes_per_block_at(t))

    # -- persistence --------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "batch_size": self.batch_size,
            "position": self.position,
            "growing": [list(g) for g in self.growing],
            "blocks": [{name: t.detach().cpu() for name, t in b.items()} for b in self.blocks],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the cache with ``torch.save`` as a plain dict of tensors, ints and strings."""
        torch.save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Cache:
        """Read a cache written by ``save`` (tensors only; no code is unpickled)."""
        d = torch.load(path, map_location=map_location, weights_only=True)
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise ValueError(f"{os.fspath(path)!r} is not a linattn cache (format {_FORMAT})")
        return cls(
            blocks=[dict(b) for b in d["blocks"]],
            growing=[tuple(g) for g in d["growing"]],
            fingerprint=d["fingerprint"],
            batch_size=int(d["batch_size"]),
            position=int(d["position"]),
        )
