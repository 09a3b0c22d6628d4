"""`python -m reference.exercises grade SOURCE --exercise NAME [...]`: sim.exercises' autograder over every exercise,
the labs that run tensors included (see `python -m sim.exercises` for the flags and exit statuses)."""
from sim.exercises.__main__ import main

from . import EXERCISES

if __name__ == "__main__":
    raise SystemExit(main(exercises=EXERCISES, prog="python -m reference.exercises"))
