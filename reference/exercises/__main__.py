"""`python -m reference.exercises grade SOURCE --exercise NAME [...]`: sim.exercises' autograder over every exercise,
the labs that run tensors included (see `python -m sim.exercises` for the flags and exit statuses).

`python -m reference.exercises package --exercise NAME|all --out DIR [--no-handout] [--hidden-visibility V]`:
Gradescope autograder archives (DIR/NAME-autograder.zip) and the student handout (DIR/handout/, DIR/handout.zip);
see package.py."""
import argparse
import sys
from pathlib import Path

from sim.exercises.__main__ import main
from sim.exercises.gradescope import VISIBILITIES

from . import EXERCISES


def package_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference.exercises package",
                                     description="Write Gradescope autograder archives and the student handout.")
    parser.add_argument("--exercise", required=True, help=f"'all' or one of: {', '.join(EXERCISES)}")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write into")
    parser.add_argument("--no-handout", action="store_true", help="write the autograder archives only")
    parser.add_argument("--hidden-visibility", default="after_published", choices=VISIBILITIES,
                        help="Gradescope visibility of the hidden checks (default after_published)")
    args = parser.parse_args(argv)
    if args.exercise != "all" and args.exercise not in EXERCISES:
        print(f"{parser.prog}: error: unknown exercise {args.exercise!r} (allowed: all, {', '.join(EXERCISES)})",
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
    if sys.argv[1:2] == ["package"]:
        raise SystemExit(package_main(sys.argv[2:]))
    raise SystemExit(main(exercises=EXERCISES, prog="python -m reference.exercises"))
