"""The `linattn` command: every experiment, report and benchmark is one subcommand.

Each subcommand lives in its own module, which defines

    configure(parser: argparse.ArgumentParser) -> None   # adds the subcommand's options
    run(args: argparse.Namespace) -> int                  # does the work, returns the exit status

and is listed once in ``COMMANDS`` below. Bad input (a ``ValueError`` or ``TypeError`` raised by the
library) and a failed read or write (an ``OSError``: a full disk, a missing file) end the command
with a one-line message naming the problem and exit status 2 (``linattn CMD: error: ...``, the
format of argparse's own errors), as does an allocation that fails; Ctrl-C ends it with one line and
exit status 130 (128 + SIGINT, as a shell reports it). Commands check their output paths before any
work (``linattn.experiments._args.output_file``), so that a bad path fails in the first second;
likewise an input file (``input_file``: a regular file, of bounded size) and the size options
(``check_memory``: what their largest tensors would take, against the machine's memory).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

# name -> module that implements it; the module's docstring's first line is the help text.
COMMANDS: dict[str, str] = {
    "accuracy": "linattn.experiments.accuracy",
    "verify": "linattn.experiments.verify",
    "table1": "linattn.experiments.table1",
    "memory": "linattn.experiments.memory",
    "costs": "linattn.experiments.costs",
    "report": "linattn.experiments.report",
    "mqar": "linattn.experiments.mqar.cli",
    "state-tracking": "linattn.experiments.state_tracking.cli",
    "cp-bytes": "linattn.experiments.cp_bytes",
    "bench": "linattn.experiments.bench",
    "build": "linattn.build",
}


class Parser(argparse.ArgumentParser):
    """argparse with one error format: ``linattn CMD: error: ...`` on one line.

    A bad value (a type or a choice refused: ``--T -1``, ``--mechanisms nope``) is not a wrong
    usage, and the usage block printed before it would bury the one line that matters; only an
    unknown option or a missing or extra argument, where the usage is the help, prints it.
    """

    _bad_value = False

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        # Every conversion and choice check of a value passes through here (argparse's own hook).
        try:
            return super()._get_values(action, arg_strings)
        except argparse.ArgumentError:
            self._bad_value = True
            raise

    def error(self, message: str) -> NoReturn:
        """Exit with status 2: one line for a bad value, argparse's usage and line otherwise."""
        if self._bad_value:
            self.exit(2, f"{self.prog}: error: {message}\n")
        super().error(message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with one subparser per entry of ``COMMANDS``.

    ``only``: the one command whose module is imported and whose options are added; the others
    are listed by name. Importing every module takes seconds (torch, scipy), and a command that
    fails on a bad input file should fail before that cost, not after it.
    """
    parser = Parser(
        prog="linattn",
        description="Attention as matrix algebra: recompute the spec's checks, tables and figures.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or name).strip().splitlines()[0]
        command = sub.add_parser(
            name,
            help=summary,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.configure(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the subcommand, return its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None  # else: the help lists them all
    try:
        args = build_parser(only).parse_args(argv)
    except KeyboardInterrupt:
        print("linattn: interrupted", file=sys.stderr)
        return 130
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"linattn {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as error:
        print(f"linattn {args.command}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as error:
        if not out_of_memory(error):
            raise
        print(f"linattn {args.command}: error: out of memory: {one_line(error)}", file=sys.stderr)
        return 2


def out_of_memory(error: BaseException) -> bool:
    """Whether error is an allocation that failed (Python's MemoryError or torch's allocator):
    the sizes passed the commands' bound (``check_memory``) but not the memory free now."""
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error)


def one_line(error: BaseException) -> str:
    """The error's message on one line (an OSError's names its file: "[Errno 28] ...: 'x'")."""
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    raise SystemExit(main())
