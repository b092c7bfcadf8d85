"""``python -m tfamp_rewrite``: the ``tfamp-rewrite`` command line."""
import sys

from .cli import main

sys.exit(main())
