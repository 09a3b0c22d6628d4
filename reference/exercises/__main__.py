"""`python -m reference.exercises grade SOURCE --exercise NAME [...]`: sim.exercises' autograder over every exercise,
the labs that run tensors included (see `python -m sim.exercises` for the flags and exit statuses).

`python -m reference.exercises package --exercise NAME|all --out DIR [--no-handout] [--hidden-visibility V]`:
Gradescope autograder archives (DIR/NAME-autograder.zip) and the student handout (DIR/handout/, DIR/handout.zip);
see package.py.

Both commands are listed by `--help`; `grade`'s own flags are sim.exercises' (declared there once), so its arguments
pass through to that parser (`grade --help` prints them)."""
import argparse
import sys
from pathlib import Path

from sim.exercises.__main__ import main
from sim.exercises.gradescope import VISIBILITIES

from . import EXERCISES

PROG = "python -m reference.exercises"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit status 2, as sim.exercises' own parser
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Grade a classroom exercise (notebooks/exercises), the labs that run "
                     "tensors included, or package the exercises for Gradescope.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("grade", add_help=False, help="grade a .py module or .ipynb notebook into Gradescope's "
                        "results.json (its flags: grade --help)")
    p = commands.add_parser("package", help="write Gradescope autograder archives and the student handout",
                            description="Write Gradescope autograder archives and the student handout.")
    p.add_argument("--exercise", required=True, help=f"'all' or one of: {', '.join(EXERCISES)}")
    p.add_argument("--out", type=Path, required=True, help="the folder to write into")
    p.add_argument("--no-handout", action="store_true", help="write the autograder archives only")
    p.add_argument("--hidden-visibility", default="after_published", choices=VISIBILITIES,
                   help="Gradescope visibility of the hidden checks (default after_published)")
    return parser


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command == "grade":  # (its flags, unknown to this parser, are in `rest`)
        return main(["grade", *rest], exercises=EXERCISES, prog=PROG)
    if rest:
        print(f"{PROG} package: unrecognized arguments: {' '.join(rest)}", file=sys.stderr)
        return 2
    return package_command(args)


def package_command(args: argparse.Namespace) -> int:
    if args.exercise != "all" and args.exercise not in EXERCISES:
        print(f"{PROG} package: error: unknown exercise {args.exercise!r} (allowed: all, {', '.join(EXERCISES)})",
              file=sys.stderr)
        return 2
    from .package import package

    names = list(EXERCISES) if args.exercise == "all" else [args.exercise]
    for path in package(names, args.out, handout=not args.no_handout, hidden_visibility=args.hidden_visibility):
        print(f"{path}  ({path.stat().st_size / 1024:.0f} KiB)")
    if not args.no_handout:
        print(f"{args.out / 'handout'}/  (the handout, unzipped)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
