"""The rule interface: what every update rule provides (docs/design.md, "Rules are modules").

A rule is the part of ``S_t = A_t S_{t-1} + k_t w_t^T`` that the gate does not cover: how one
token writes the memory (its step) and, for the chunk form of section 8, how a chunk's
pseudo-values U follow from its values (``U = U0 - W S``, S the state entering the chunk). The
gate (none, per head, per key channel) is the diagonal part of A_t, handled alike for every rule
by the chunk terms (``_chunk_terms``). The chunk loop (``chunk``), the recurrent form
(``recurrent``), the checks of the ops (``library``) and the generation step (``step``) call a
rule through this interface only; none of them knows a rule by its name.

A rule declares:

    NAME                 its name in the ops' schema (``rule``) and the registry
    INPUTS               its per-token inputs beyond q, k, v and the gate (``Input``): names,
                         widths ("1", "K" or "V" numbers a token and value head) and ranges. They
                         travel packed in one rule-owned slot (the ops' ``beta`` argument): one
                         input of width 1 as [B, HV, T], otherwise concatenated along a last axis
                         [B, HV, T, sum of widths] in the order declared (``pack``, ``split``)
    READS_STATE          whether a chunk's U depends on the state entering it
    PRODUCTS             the decayed causal products it needs besides A_qk: (left factor's name,
                         strictly causal) pairs, each times k on the right
    DECAYED_KEYS         whether its terms read Kd = K exp(G)
    STACKED              whether its chunk writes along more vectors than its keys (then it
                         also defines ``gradients``)
    CHUNK_SIZE           its ops' default chunk size
    FUSED                whether the fused C++ kernels (csrc/rules/) compute it

and defines

    write(S, k_t, v_t, x_t) -> u_t                 the step's write, read from the decayed state
    entering_write(S, x_t) -> (a_t, r_t) | None    a write that reads the state before the decay
    pseudo_value_terms(terms) -> PseudoValueTerms  its typed chunk terms (W, U0 and its own)
    pseudo_values(terms, S, j, out)                U = U0 - W S (the default)
    state_gradient_(terms, j, dU_j, dS_j)          dS_j -= W_j^T dU_j (the default)
    pseudo_value_backward(terms, dU, S)            (dv, dx, dKd, [dA of each of PRODUCTS]), or
                                                   NotImplementedError: autograd differentiates
                                                   the rule's terms instead (``HAND_WRITTEN``)

A rule written outside the package subclasses ``Rule`` and is registered with
``linattn.ops.rules.register``; see docs/adding-a-mechanism.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

WIDTHS = ("1", "K", "V")


def read(S: Tensor, x: Tensor) -> Tensor:
    """S^T x for every batch and head: S [..., K, V], x [..., K] -> [..., V] (broadcasting: x
    [B, H, 1, K] reads the G states [B, H, G, K, V] of its value heads)."""
    return (x.unsqueeze(-2) @ S).squeeze(-2)  # [..., 1, K] @ [..., K, V]


@dataclass(frozen=True)
class Input:
    """One per-token input of a rule: its name (as the public op takes it), its width ("1": one
    number a token and value head, "K" or "V": a vector of the key or value size) and the closed
    range its values must lie in (None: unbounded; every value must be finite)."""

    name: str
    width: str = "1"
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.width not in WIDTHS:
            raise ValueError(
                f"Input {self.name!r}: width must be one of {WIDTHS}, got {self.width!r}"
            )
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Input {self.name!r}: low {self.low} is above high {self.high}")

    def size(self, K: int, V: int) -> int:
        """Numbers a token and value head: 1, K or V."""
        return {"1": 1, "K": K, "V": V}[self.width]


@dataclass
class PseudoValueTerms:
    """A rule's state-independent chunk terms, ``U = U0 - W S`` (W None: U = U0, whatever S).

    A stacked rule (``Rule.STACKED``) also gives the directions its chunk writes along, ``Ke``
    [n, P, writes C, K], and the output scores over them, ``A_qk`` [n, P, C, writes C], which
    replace the keys' own in the chunk loop. A rule's own terms (those its backward reads) are
    the fields of its subclass."""

    W: Tensor | None
    U0: Tensor
    Ke: Tensor | None = None
    A_qk: Tensor | None = None


class Rule(ABC):
    """An update rule (the module docstring lists what it declares and defines)."""

    NAME: ClassVar[str]
    INPUTS: ClassVar[tuple[Input, ...]] = ()
    READS_STATE: ClassVar[bool] = True
    PRODUCTS: ClassVar[tuple[tuple[str, bool], ...]] = ()
    DECAYED_KEYS: ClassVar[bool] = False
    STACKED: ClassVar[bool] = False
    CHUNK_SIZE: ClassVar[int] = 64
    FUSED: ClassVar[bool] = False

    # --- its inputs -------------------------------------------------------------------------

    def slot_shape(self, K: int, V: int) -> tuple[int, ...] | None:
        """The trailing shape of the rule's slot per token and value head: None (no inputs),
        () (one input of width 1) or (sum of the widths,)."""
        if not self.INPUTS:
            return None
        if len(self.INPUTS) == 1 and self.INPUTS[0].width == "1":
            return ()
        return (sum(x.size(K, V) for x in self.INPUTS),)

    def slot_layout(self) -> str:
        """The slot's shape in words, for errors: "[B, HV, T]" or "[B, HV, T, K + V]"."""
        shape = self.slot_shape(1, 1)
        if shape == ():
            return "[B, HV, T]"
        widths = " + ".join(x.width for x in self.INPUTS)
        return f"[B, HV, T, {widths}] (= [{' | '.join(x.name for x in self.INPUTS)}])"

    def pack(self, inputs: dict[str, Tensor], dtype: torch.dtype) -> Tensor | None:
        """The slot from the rule's inputs in the public layout [B, T, HV(, width)], in
        ``dtype`` (one tensor: no copy for a single input of width 1)."""
        if not self.INPUTS:
            return None
        if self.slot_shape(1, 1) == ():
            return inputs[self.INPUTS[0].name]
        parts = [inputs[x.name].to(dtype) for x in self.INPUTS]
        parts = [
            p.unsqueeze(-1) if x.width == "1" else p
            for p, x in zip(parts, self.INPUTS, strict=True)
        ]
        return torch.cat(parts, dim=-1)

    def split(self, slot: Tensor | None, K: int, V: int) -> dict[str, Tensor]:
        """The rule's inputs by name from its slot [..., (width)] (views); K, V: the key and
        value sizes the widths refer to."""
        if slot is None or not self.INPUTS:
            return {}
        if self.slot_shape(K, V) == ():
            return {self.INPUTS[0].name: slot}
        sizes = [x.size(K, V) for x in self.INPUTS]
        parts = slot.split(sizes, dim=-1)
        return {
            x.name: part.squeeze(-1) if x.width == "1" else part
            for x, part in zip(self.INPUTS, parts, strict=True)
        }

    # --- the step ---------------------------------------------------------------------------

    @abstractmethod
    def write(self, S: Tensor, k_t: Tensor, v_t: Tensor, x_t: Tensor | None) -> Tensor:
        """u_t of the write k_t u_t^T, from the decayed state S [..., K, V], the key k_t, the
        value v_t and the rule's slot x_t of this token."""

    def entering_write(self, S: Tensor, x_t: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """(a_t, r_t): a second write a_t r_t^T whose r_t reads the state entering the token,
        before its decay; None (the default) for a rule without one."""
        return None

    # --- the chunk form ---------------------------------------------------------------------

    @abstractmethod
    def pseudo_value_terms(self, terms) -> PseudoValueTerms:
        """The state-independent terms of every chunk of ``terms`` (``_chunk_terms.Terms``:
        its q, k, v, ``beta`` (the rule's slot, [n, P, C(, width)]), G, Kd, products)."""

    def pseudo_values(self, terms, S: Tensor, j: int | None = None, out: Tensor | None = None):
        """U = U0 - W S of chunk j entering with S [P, K, V], or of every chunk (j None, S
        [n, P, K, V])."""
        U0, W = terms.U0, terms.W
        if W is None:
            return U0 if j is None else U0[j]
        if j is not None:
            return torch.baddbmm(U0[j], W[j], S, alpha=-1, out=out)
        # [n, P, R, .] -> [n P, R, .]: one batched product for every chunk
        U = torch.baddbmm(U0.flatten(0, 1), W.flatten(0, 1), S.flatten(0, 1), alpha=-1)
        return U.view(U0.shape)

    def state_gradient_(self, terms, j: int, dU_j: Tensor, dS_j: Tensor) -> None:
        """U_j = U0_j - W_j S_j: dS_j -= W_j^T dU_j (nothing where U does not read S)."""
        if terms.W is not None:
            dS_j.baddbmm_(terms.W[j].transpose(-1, -2), dU_j, alpha=-1)

    def pseudo_value_backward(self, terms, dU: Tensor, S: Tensor) -> tuple:
        """(dv, dslot, dKd, [dA of each of PRODUCTS]) from dU and the states S entering the
        chunks. A rule that does not write it (the default) is differentiated by autograd."""
        raise NotImplementedError

    @property
    def HAND_WRITTEN(self) -> bool:  # noqa: N802 (a constant of the rule's class)
        """Whether the rule's chunk backward is its own (else autograd's, on the all-blocks
        form: ``library.chunk``)."""
        return type(self).pseudo_value_backward is not Rule.pseudo_value_backward

    def __repr__(self) -> str:
        return f"<rule {self.NAME!r}>"
