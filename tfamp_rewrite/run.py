"""``python -m tfamp_rewrite.run``: the documented alias of ``tfamp-run`` (see ``training/run.py``)."""
import sys

from .training.run import main

if __name__ == "__main__":
    sys.exit(main())
