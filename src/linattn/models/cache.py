"""``Cache``: the generation state of a ``CausalLM``, one dict of tensors per block (spec 5, 9).

A recurrent block holds its memory ``S`` ([B, H, K, V], fixed size) and its short convolution's last
inputs ([B, channels, kernel - 1]) or, for RWKV-7, its token shift's last input ([B, d_model]); a
softmax block holds its KV cache (``k``, ``v``: [B, t, H, D]), which grows with the number t of
tokens seen. ``nbytes()`` and ``numbers_per_block()`` count the tensors held; ``nbytes_at(t)``
the bytes the same structure holds after t tokens (the growing tensors' per-token size times t,
the others as they are).

File format (``save``/``load``): ``torch.save`` of a plain dict (``to_dict``) with a SHA-256
``checksum`` over every other field and every tensor's dtype, shape and bytes, so that a flipped
byte anywhere in the payload is a clear error rather than a silently different state. ``save``
writes a temporary file beside the target and renames it over the target: a failure mid-write
(a full disk) leaves the previous file as it was.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import tempfile

import torch
from torch import Tensor

_FORMAT = "linattn.cache/2"  # /2: with a checksum


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
        _check_count("batch_size", batch_size, 0)  # 0: an empty batch, as in PyTorch
        _check_count("position", position, 0)
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
        """The cache as a plain dict of tensors, ints and strings, with its ``checksum``."""
        d = {
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "batch_size": self.batch_size,
            "position": self.position,
            "growing": [list(g) for g in self.growing],
            "blocks": [{name: t.detach().cpu() for name, t in b.items()} for b in self.blocks],
        }
        d["checksum"] = checksum(d)
        return d

    def save(self, path: str | os.PathLike) -> None:
        """Write the cache with ``torch.save``; atomically: the old file survives a failed write.

        The dict is written to a temporary file in the target's folder (so that the rename stays
        on one file system), flushed to disk, then renamed over ``path``.
        """
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(self.to_dict(), handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Cache:
        """Read a cache written by ``save`` (tensors only; no code is unpickled).

        ``ValueError`` naming the file for anything but a complete, unaltered cache file: another
        file, a truncated one, a missing or mistyped field, a checksum that does not match.
        """
        name = repr(os.fspath(path))
        try:
            d = torch.load(path, map_location=map_location, weights_only=True)
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
            # a truncated or altered file: torch reports a bad zip archive as EINVAL
            reason = " ".join(str(error).split())[:200]
            raise ValueError(f"{name} is not a readable linattn cache ({reason})") from None
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise ValueError(f"{name} is not a linattn cache (format {_FORMAT})")
        _check_fields(name, d)
        if d["checksum"] != checksum(d):
            raise ValueError(f"{name} is corrupt: its checksum does not match its contents")
        return cls(
            blocks=[dict(b) for b in d["blocks"]],
            growing=[tuple(g) for g in d["growing"]],
            fingerprint=d["fingerprint"],
            batch_size=d["batch_size"],
            position=d["position"],
        )


def checksum(d: dict) -> str:
    """SHA-256 (hex) of a cache dict's fields and tensors, its own ``checksum`` entry excepted.

    Each tensor contributes its name, dtype, shape and bytes (as stored, on the CPU), so that the
    same cache gives the same checksum on every machine and a changed byte changes it.
    """
    h = hashlib.sha256()
    meta = [d["format"], d["fingerprint"], d["batch_size"], d["position"], d["growing"]]
    h.update(repr(meta).encode())
    for i, block in enumerate(d["blocks"]):
        for name in sorted(block):
            t = block[name].detach().cpu().contiguous()
            h.update(repr((i, name, str(t.dtype), tuple(t.shape))).encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_FIELDS = {
    "fingerprint": str,
    "batch_size": int,
    "position": int,
    "growing": list,
    "blocks": list,
    "checksum": str,
}


def _check_fields(name: str, d: dict) -> None:
    """Every field of a cache dict is there with its type (before the checksum reads them)."""
    for field, kind in _FIELDS.items():
        if field not in d:
            raise ValueError(f"{name} is not a complete linattn cache: no {field!r}")
        if not isinstance(d[field], kind) or isinstance(d[field], bool):
            raise ValueError(f"{name}: {field!r} must be a {kind.__name__}")
    blocks_ok = all(
        isinstance(b, dict) and all(isinstance(t, Tensor) for t in b.values()) for b in d["blocks"]
    )
    growing_ok = all(
        isinstance(g, list) and all(isinstance(n, str) for n in g) for g in d["growing"]
    )
    if not (blocks_ok and growing_ok):
        raise ValueError(f"{name}: 'blocks' must be dicts of tensors, 'growing' lists of names")


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
