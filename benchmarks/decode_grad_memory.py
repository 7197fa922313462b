"""What autograd keeps for one decoding step taken with grad on.

    PYTHONPATH=src python benchmarks/decode_grad_memory.py

A model that decodes without ``torch.no_grad()`` (fla's generation tests do) records a graph for
every step, and each step's graph keeps what its attention op saved for the backward. For one
token (one chunk) the state entering the chunk is the initial state itself. This prints, for the
chunk form of linear attention, Gated DeltaNet and KDA at the sizes of fla's generation test
(B 4, H 8, K 256, V 512, float32 state), the bytes of the tensors saved for one step
(``torch.autograd.graph.saved_tensors_hooks``, each storage counted once) and that total in
states of the step's size.
"""

from __future__ import annotations

import argparse

import torch

from linattn.ops import delta_rule, linear_attention


def saved_bytes(fn) -> int:
    """The bytes of the distinct storages autograd saves while ``fn()`` records its graph."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--K", type=int, default=256)
    parser.add_argument("--V", type=int, default=512)
    args = parser.parse_args()
    B, H, K, V = args.B, args.H, args.K, args.V
    gen = torch.Generator().manual_seed(0)

    def x(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    q, k, v = x(B, 1, H, K), x(B, 1, H, K), x(B, 1, H, V)
    beta = torch.rand(B, 1, H, generator=gen).requires_grad_()
    g_head = (-torch.rand(B, 1, H, generator=gen)).requires_grad_()
    g_channel = (-torch.rand(B, 1, H, K, generator=gen)).requires_grad_()
    S0 = x(B, H, K, V)
    state = S0.numel() * S0.element_size()
    calls = {
        "linear": lambda: linear_attention(q, k, v, initial_state=S0, output_final_state=True),
        "gated_delta": lambda: delta_rule(
            q, k, v, beta, g_head, initial_state=S0, output_final_state=True
        ),
        "kda": lambda: delta_rule(
            q, k, v, beta, g_channel, initial_state=S0, output_final_state=True
        ),
    }
    print(f"B {B}, H {H}, K {K}, V {V}, one token, chunk form, state {state / 2**20:.1f} MiB")
    print("| mechanism | saved MiB | in states |")
    print("|---|---|---|")
    for name, call in calls.items():
        n = saved_bytes(call)
        print(f"| {name} | {n / 2**20:.1f} | {n / state:.2f} |")


if __name__ == "__main__":
    main()
