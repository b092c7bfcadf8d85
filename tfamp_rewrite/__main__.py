"""``python -m tfamp_rewrite``: the ``tfamp-rewrite`` command line."""
import sys

from .saved_graph.cli import main

sys.exit(main())
