"""Every mechanism on a GPU: linattn's PyTorch loop, fla's kernels directly, linattn's dispatch.

    PYTHONPATH=src python benchmarks/gpu.py [--T 4096 8192 16384 32768 65536] [--out FILE]
    PYTHONPATH=src python benchmarks/gpu.py --smoke --out /tmp/gpu-smoke.json   # no GPU

For each registered mechanism fla has (``linattn.dispatch.table``), at each T, the forward and
the forward + backward (gradients of every input) of three paths on the same inputs (the
registry case's, with the query heads per key head fla's kernel needs, ``dispatch.query_groups``;
without states where fla's are not the op's):

- ``torch``: linattn's op inside ``backend("native")``: on a CUDA tensor the PyTorch chunk loop;
- ``fla``: fla's function called directly with the arguments the dispatch gives it;
- ``dispatch``: linattn's op as a user calls it (``backend("auto")``), which should cost what
  ``fla`` costs plus the decision.

Each time is the median of ``--repeats`` runs after ``--warmup`` (Triton compiles and autotunes on
the first call), synchronised. Before timing, each mechanism's dispatched call is checked against
the same op in float64 on the GPU (linattn's loop: float64 never goes to fla) at ``--check-T``
tokens in float32 (float16 where fla's kernel refuses float32): the largest error of o and of the
final states relative to the largest reference entry, and whether it is within the tolerance
(``TOLERANCE``: fla's kernels multiply in TF32 on a GPU). A mechanism whose call fla refuses at
this shape or here (``dispatch``'s facts: head sizes, flash-attn not installed) is listed with
the reason, not timed. Timings run in ``--dtype`` (bfloat16,
fla's training dtype). A run stops starting new measurements after ``--budget-s`` seconds (the
rest are listed as skipped), to stay within a lent machine's time.

``--smoke`` runs the whole path on CPU tensors under Triton's interpreter (tests/fla_interpreter.py,
set up before fla is imported, with its stand-ins for what some kernels need there) at a tiny
shape in float32: what tests/test_gpu_benchmark.py runs. Its timings mean nothing; its agreement
uses the interpreter's float32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {"float32": 5e-3, "float16": 1e-2}  # on a GPU (TF32 products)
SMOKE_TOLERANCE = {"float32": 5e-5, "float16": 4e-3}  # the interpreter: exact float32 products


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--B", type=int, default=1)
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--K", type=int, default=128, help="key and value size")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--check-T", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--mechanisms", nargs="+", help="registry names (default: every one)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    parser.add_argument("--smoke", action="store_true", help="CPU tensors, interpreter, tiny")
    args = parser.parse_args(argv)
    if args.smoke:
        args.T, args.B, args.H, args.K, args.dtype = [32], 1, 1, 16, "float32"
        args.check_T, args.warmup, args.repeats = 16, 0, 1  # the check cuts the inputs to 16
    return args


def setup(smoke: bool):
    """The device, and fla on it: under ``--smoke`` Triton's interpreter on the CPU (set before
    fla is imported, with the repository's patches for it)."""
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(ROOT))
        from tests import fla_interpreter  # patches triton's interpreter for fla

        fla_interpreter.cyfa_on_cpu()
        fla_interpreter.boolean_masks()
        fla_interpreter.flash_attn_on_cpu()
    import torch

    if not smoke and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device (or --smoke for the CPU path)")
    return torch.device("cpu" if smoke else "cuda")


def through_op(entry, given: dict, choice: str):
    """``entry``'s op on ``given`` inside ``backend(choice)``: its tensors (o, final states)."""
    from linattn import dispatch
    from linattn.ops import backend

    with backend(choice):
        return dispatch.tensors(dispatch.call(entry, given))


def through_fla(fn, kwargs: dict):
    """fla's function called directly: its tensors (o, final states)."""
    from linattn import dispatch

    return dispatch.tensors(fn(**kwargs))


def cast(value, dtype, grad: bool = False):
    """A case's input in ``dtype`` (a tensor, or a tuple of them: a state of parts)."""
    import torch

    if isinstance(value, tuple):
        return tuple(cast(t, dtype, grad) for t in value)
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(dtype).detach().requires_grad_(grad)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = setup(args.smoke)
    import torch

    from linattn import dispatch, registry
    from linattn.ops import backend, backends

    auto = "fla" if args.smoke else "auto"  # no GPU in a smoke run: dispatch is forced
    loop = "torch" if args.smoke else "native"  # the PyTorch loop (CUDA has no fused kernels)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    tolerance = SMOKE_TOLERANCE if args.smoke else TOLERANCE
    started = time.perf_counter()
    names = args.mechanisms or list(dispatch.table())

    longest = max(*args.T, args.check_T)
    drawn = {}

    def inputs(entry, T, dtype, grad):
        """The case's inputs at T tokens: drawn once per mechanism at the longest T (on the
        CPU, which takes seconds at 64K) and cut to the first T tokens (DeltaProduct's write
        rows: T n_h), in ``dtype`` on the device; the op's arguments for them, without states
        where fla refuses the call with them."""
        if entry.name not in drawn:
            drawn.clear()  # one mechanism's at a time on the device
            groups = dispatch.query_groups(entry)  # k and v on H heads, q on G H
            x = entry.case.inputs(args.B, longest, args.H * groups, args.K, args.K, 0,
                                  torch.float32)  # fmt: skip
            x = {n: t[:, :, : args.H] if n in ("k", "v") and groups > 1 else t
                 for n, t in x.items()}  # fmt: skip
            if isinstance(x.get("S0"), tuple):  # a pair of states: its parts
                x.update({f"S0_{i}": t for i, t in enumerate(x.pop("S0"))})
            drawn[entry.name] = {n: None if t is None else t.to(device) for n, t in x.items()}
        x = {}
        for n, t in drawn[entry.name].items():
            if t is not None and t.dim() >= 3 and t.shape[1] % longest == 0:
                t = t[:, : t.shape[1] // longest * T]  # a time axis: [B, T (n_h), ...]
            x[n] = cast(t, dtype, grad)
        given = dispatch.arguments(entry, x)
        if isinstance(dispatch.resolve_call(entry, given), str):  # refused: try it stateless
            return dispatch.arguments(entry, x, initial_state=None, output_final_state=False)
        return given

    def timed(fn, backward):
        def once():
            out = fn()
            if backward:
                torch.autograd.backward([t for t in out if t is not None and t.requires_grad],
                                        [torch.ones_like(t) for t in out
                                         if t is not None and t.requires_grad])  # fmt: skip
            sync()

        for _ in range(args.warmup):
            once()
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            once()
            runs.append(time.perf_counter() - start)
        return statistics.median(runs) * 1e3

    def check(entry):
        """The dispatched call against float64 on the device (o and the final state)."""
        reasons = []
        for dtype in (torch.float32, torch.float16):
            given = inputs(entry, args.check_T, dtype, False)
            chosen = dispatch.resolve_call(entry, given)
            if isinstance(chosen, tuple):
                break
            reasons.append(chosen)
        else:
            return {"refused": "; ".join(reasons)}
        with backend(auto):
            got = dispatch.tensors(dispatch.call(entry, given))
        exact = {n: cast(t, torch.float64) for n, t in given.items()}
        want = dispatch.tensors(dispatch.call(entry, exact))
        name = str(dtype).removeprefix("torch.")
        errors = [float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))
                  for a, b in zip(got, want, strict=True) if b.numel()]  # fmt: skip
        state = max(errors[1:], default=0.0)  # o first, then the final states (none: 0)
        return {"dtype": name, "fla_name": chosen.function.__name__, "o_rel": errors[0],
                "state_rel": state, "tolerance": tolerance[name],
                "ok": max(errors) <= tolerance[name]}  # fmt: skip

    rows, checks, skipped = [], {}, []
    dtype = getattr(torch, args.dtype)
    for name in names:
        entry = registry.get(name)
        checks[name] = check(entry)
        print(f"{name:14s} check {checks[name]}", flush=True)
        if "refused" in checks[name]:
            continue  # fla takes no call of it at this shape or here: nothing to time
        for T in args.T:
            if time.perf_counter() - started > args.budget_s:
                skipped.append({"mechanism": name, "T": T})
                continue
            row = {"mechanism": name, "T": T}
            for backward in (False, True):
                given = inputs(entry, T, dtype, backward)
                chosen = dispatch.resolve_call(entry, given)
                kind = "fwdbwd" if backward else "fwd"
                if not isinstance(chosen, tuple):
                    row[f"{kind}_note"] = chosen  # fla does not take the call in this dtype
                    continue
                fn, kwargs = chosen.function, chosen.kwargs
                paths = (
                    ("torch", partial(through_op, entry, given, loop)),
                    ("fla", partial(through_fla, fn, kwargs)),
                    ("dispatch", partial(through_op, entry, given, auto)),
                )
                for path, run in paths:
                    try:
                        row[f"{path}_{kind}_ms"] = timed(run, backward)
                    except Exception as error:  # noqa: BLE001 - out of memory, no backward
                        row[f"{path}_{kind}_ms"] = None
                        row[f"{path}_{kind}_error"] = f"{type(error).__name__}: {error}"[:300]
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                row[f"fla_name_{kind}"] = fn.__name__
            rows.append(row)
            print(f"{name:14s} T {T:6d} {row}", flush=True)
    result = {
        "setup": {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)",
            "torch": torch.__version__, "python": platform.python_version(),
            "B": args.B, "H": args.H, "K": args.K, "V": args.K, "dtype": args.dtype,
            "check_T": args.check_T, "warmup": args.warmup, "repeats": args.repeats,
            "smoke": args.smoke, "seconds": round(time.perf_counter() - started, 1),
            "decision": backends.__name__,
        },
        "checks": checks, "rows": rows, "skipped": skipped,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['setup']['seconds']} s")
    return 0 if all(c.get("ok") for c in checks.values() if "refused" not in c) else 1


if __name__ == "__main__":
    raise SystemExit(main())
