"""`python -m sim ...`: see sim/cli.py."""
import sys

from .cli import main

sys.exit(main())
