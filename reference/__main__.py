"""`python -m reference ...`: see reference/cli.py."""
import sys

from reference.cli import main

sys.exit(main())
