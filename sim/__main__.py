"""`python -m sim ...`: see sim/drivers/cli.py."""
import sys

from .drivers.cli import main

if __name__ == "__main__":  # not when a spawned process (python -m sim bench's runs) imports it
    sys.exit(main())
