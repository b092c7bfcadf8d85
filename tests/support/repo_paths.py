"""Where things are in the checkout, for tests that run its scripts or copy it."""
import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)
REPO = os.path.dirname(TESTS)
EXAMPLES = os.path.join(REPO, "examples")
BENCHMARKS = os.path.join(REPO, "benchmarks")
SCRIPTS = os.path.join(SUPPORT, "scripts")
