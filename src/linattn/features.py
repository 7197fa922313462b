"""Feature maps phi for linear attention (spec sections 3 and 4).

Linear attention replaces the softmax kernel exp(q^T k / sqrt(d)) with phi(q)^T phi(k) for a
feature map phi: R^d -> R^r. Apply phi to queries and keys (shape [..., d] -> [..., r]) before
``linattn.ops.linear_attention``. Each map documents its feature dimension r.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.dtypes import compute_dtype


def elu_plus_one(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1, entry by entry (Katharopoulos et al., 2020; section 4). r = d.

    x + 1 for x > 0 and e^x for x <= 0: positive, so normalised outputs are weighted averages.
    """
    return F.elu(x) + 1.0


def relu(x: Tensor) -> Tensor:
    """phi(x) = max(x, 0), entry by entry. r = d. Nonnegative, but a row can be all zero."""
    return F.relu(x)


def identity(x: Tensor) -> Tensor:
    """phi(x) = x. r = d. The plain bilinear kernel q^T k (use without normalize)."""
    return x


def taylor_exp(x: Tensor, scale: float | None = None) -> Tensor:
    """Second-order Taylor features of exp (Based; section 3). r = 1 + d + d^2.

    With y = sqrt(s) x, phi(x) = [1, y, vec(y y^T) / sqrt(2)], so that
    phi(q)^T phi(k) = 1 + s q^T k + (s q^T k)^2 / 2, the Taylor expansion of exp(s q^T k) to second
    order. s = ``scale`` defaults to 1 / sqrt(d), the softmax's scale, folded in as Based does;
    pass ``scale=1.0`` to linear_attention afterwards. The kernel is positive (1 + a + a^2/2 > 0).
    """
    d = x.shape[-1]
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)
    y = x * math.sqrt(s)
    second = (y.unsqueeze(-1) * y.unsqueeze(-2)).flatten(-2) / math.sqrt(2.0)  # [..., d * d]
    return torch.cat([torch.ones_like(y[..., :1]), y, second], dim=-1)


def gaussian_blocks(
    num_features: int,
    dim: int,
    *,
    orthogonal: bool,
    generator: torch.Generator,
    batch: tuple[int, ...] = (),
) -> Tensor:
    """Projection rows omega_1..omega_r, shape [*batch, r, d], float64 (batch: independent draws).

    i.i.d.: rows drawn from N(0, I_d). Orthogonal (Choromanski et al., 2021): stack ceil(r / d)
    blocks of d exactly orthogonal directions (QR of a Gaussian matrix), each row rescaled to the
    length of an independent N(0, I_d) vector, so every row is still marginally N(0, I_d) and the
    estimate stays unbiased, while the rows of one block cannot be redundant.
    """
    shape = (*batch, num_features, dim)
    if not orthogonal:
        return torch.randn(shape, generator=generator, dtype=torch.float64)
    n_blocks = math.ceil(num_features / dim)
    G = torch.randn(*batch, n_blocks, dim, dim, generator=generator, dtype=torch.float64)
    Q, R = torch.linalg.qr(G)
    # Sign fix so that each Q is Haar-distributed (uniform over the orthogonal matrices).
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    # The rows of Q^T are orthonormal: [*batch, n_blocks, d, d] -> [*batch, n_blocks * d, d].
    directions = Q.transpose(-1, -2).reshape(*batch, n_blocks * dim, dim)[..., :num_features, :]
    lengths = torch.randn(shape, generator=generator, dtype=torch.float64).norm(dim=-1)
    return directions * lengths.unsqueeze(-1)


class PositiveRandomFeatures(nn.Module):
    """Positive random features, FAVOR+ (Choromanski et al., 2021; section 4). r = num_features.

    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(r) with x' = x / d^(1/4), so that
    E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d)), the softmax kernel with its 1/sqrt(d) folded in
    (the spec's "apply phi to q / d^(1/4) and k / d^(1/4)"); pass ``scale=1.0`` to the op.
    ``fold_scale=False`` gives the unscaled estimate of exp(q^T k).

    Args:
        dim: d, the input dimension. num_features: r.
        orthogonal: orthogonal random blocks (lower variance) or i.i.d. rows.
        seed: seed of the draw (None: a fresh random seed).
        fold_scale: fold the 1/sqrt(d) in (default True).

    The projection W [r, d] is a buffer (saved with the model, not trained); ``redraw(seed)``
    draws a new one explicitly; nothing is redrawn implicitly.
    """

    def __init__(
        self,
        dim: int,
        num_features: int,
        *,
        orthogonal: bool = True,
        seed: int | None = None,
        fold_scale: bool = True,
    ) -> None:
        super().__init__()
        if dim < 1 or num_features < 1:
            raise ValueError(f"dim and num_features must be >= 1, got {dim} and {num_features}")
        self.dim, self.num_features = dim, num_features
        self.orthogonal, self.fold_scale = orthogonal, fold_scale
        self.register_buffer("W", torch.empty(num_features, dim, dtype=torch.float64))
        self.redraw(seed)

    @torch.no_grad()
    def redraw(self, seed: int | None = None) -> None:
        """Draw a new projection W (seeded if ``seed`` is given)."""
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        W = gaussian_blocks(
            self.num_features, self.dim, orthogonal=self.orthogonal, generator=generator
        )
        self.W.copy_(W.to(self.W.dtype))

    def forward(self, x: Tensor) -> Tensor:
        """[..., d] -> [..., r], computed in float32 at least, returned in the input dtype."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim = {self.dim}, got {tuple(x.shape)}")
        dtype = compute_dtype(x.dtype)
        y = x.to(dtype)
        if self.fold_scale:
            y = y / self.dim**0.25
        logits = y @ self.W.to(dtype).T - 0.5 * (y * y).sum(dim=-1, keepdim=True)
        return (torch.exp(logits) / math.sqrt(self.num_features)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_features={self.num_features}, orthogonal={self.orthogonal}"
