"""Tiny stand-in models for the MQAR training tests (the real model lives in linattn.models)."""

from __future__ import annotations

import torch
from torch import nn


class TinyGRU(nn.Module):
    """Embedding -> GRU -> linear: a causal map from token ids [B, T] to logits [B, T, vocab]."""

    def __init__(self, vocab_size: int, d_model: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.rnn = nn.GRU(d_model, d_model, batch_first=True)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(input_ids))  # [B, T, d_model]
        return self.head(hidden)  # [B, T, vocab]


class Oracle(nn.Module):
    """Answers every query by looking the key up in the context: accuracy 1 by construction."""

    def __init__(self, vocab_size: int, n_kv: int) -> None:
        super().__init__()
        self.vocab_size, self.n_kv = vocab_size, n_kv
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # something for AdamW to hold

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        keys = input_ids[:, 0 : 2 * self.n_kv : 2]  # [B, n]
        values = input_ids[:, 1 : 2 * self.n_kv : 2]  # [B, n]
        match = input_ids[:, :, None] == keys[:, None, :]  # [B, T, n]
        answer = (match.long() * values[:, None, :]).sum(-1)  # [B, T]; 0 where no key
        logits = 10.0 * nn.functional.one_hot(answer, self.vocab_size).float()
        return logits + self.bias
