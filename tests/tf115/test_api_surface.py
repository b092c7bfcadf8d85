"""Every TensorFlow name the package and its examples use exists in TensorFlow 1.15.

TensorFlow 1.15's Python API cannot be imported here; its sources from the wheel are read
instead (python_api_tree.py): each dotted name our sources use (``tf.compat.v1.*``,
``tensorflow.python.*`` imports, ``tf.sysconfig`` calls, proto messages) must resolve in
1.15's tree, and each call of a 1.15 Python function must fit its signature. Protocol
buffer fields are matched by name against the fields TensorFlow 2.x's versions of the
same messages added since 1.15 (proto_names.py). Names reached through strings
(``getattr(module, "get", None)``, descriptor look-ups) are how code guards what only
one version has; they are not names here.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf
from proto_names import ProtoSchema
from python_api_tree import ApiTree, Missing, accepts_call
from repo_paths import REPO
from tensorflow_uses import attribute_names, tensorflow_uses

ROOT = Path(REPO)
SOURCES = (sorted((ROOT / "tfamp_rewrite").rglob("*.py")) + [ROOT / "tfamp_rewrite_startup.py"]
           + sorted((ROOT / "examples").rglob("*.py")))


@pytest.fixture(scope="module")
def api(tf115_tree):
    return ApiTree(tf115_tree.root, {"tensorflow": "tensorflow_core"})


@pytest.fixture(scope="module")
def uses():
    return [use for path in SOURCES for use in tensorflow_uses(path)]


def where(use) -> str:
    return "%s:%d" % (Path(use.path).relative_to(ROOT), use.line)


def test_the_checker_tells_15_names_from_newer_ones(api):
    assert not isinstance(api.resolve(("tensorflow", "compat", "v1", "train", "Optimizer", "minimize")),
                          Missing)
    for newer in [("tensorflow", "nn", "gelu"), ("tensorflow", "experimental", "numpy"),
                  ("tensorflow", "python", "framework", "op_def_registry", "get"),
                  ("tensorflow", "compat", "v1", "GraphKeys", "NO_SUCH_KEY")]:
        assert isinstance(api.resolve(newer), Missing), newer
    conv2d = api.resolve(("tensorflow", "nn", "conv2d"))
    assert not any(accepts_call(node, 2, ("no_such_argument",))[0] for node, _ in conv2d.definitions)


def test_every_tensorflow_name_used_exists_in_tf115(api, uses, verified):
    missing = []
    for use in uses:
        result = api.resolve(use.chain)
        if isinstance(result, Missing):
            missing.append("%s: %s: TensorFlow 1.15 has no %r in %s" % (
                where(use), ".".join(use.chain), use.chain[result.index], result.where))
    assert missing == [], "\n".join(missing)
    names = {use.chain for use in uses}
    verified("API surface", "all %d TensorFlow names used (%d uses in %d files of tfamp_rewrite/ and "
             "examples/) exist in TF 1.15's Python API tree" % (len(names), len(uses), len(SOURCES)))


# The tests that run with TF1 behaviour, the program corpus and their helpers: what TF 1.15's
# own Python would run (tests/tf115 and tests/gpu run elsewhere by design).
TEST_SOURCES = sorted(path for folder in ("training", "doctor", "saved_graph", "examples", "programs",
                                          "graph_rewrite", "fused_op", "support")
                      for path in (ROOT / "tests" / folder).rglob("*.py"))


def test_every_tensorflow_name_the_tests_use_exists_in_tf115(api, verified):
    """Tests reach what only TensorFlow 2 has by a guarded look-up (tests/support/tf_api.py)."""
    uses = [use for path in TEST_SOURCES for use in tensorflow_uses(path)]
    missing = ["%s: %s" % (where(use), ".".join(use.chain)) for use in uses
               if isinstance(api.resolve(use.chain), Missing)]
    assert missing == [], "\n".join(missing)
    verified("API surface", "all %d TensorFlow names the tests use (%d files) exist in TF 1.15"
             % (len({use.chain for use in uses}), len(TEST_SOURCES)))


def test_every_call_fits_tf115s_signature(api, uses, verified):
    mismatched, checked = [], 0
    for use in uses:
        result = api.resolve(use.chain) if use.call else None
        if result is None or isinstance(result, Missing) or result.kind != "def":
            continue
        checked += 1
        verdicts = [accepts_call(node, *use.call) for node, _ in result.definitions]
        if not any(ok for ok, _ in verdicts):
            mismatched.append("%s: %s(%d positional, %s): in TensorFlow 1.15 it %s" % (
                where(use), ".".join(use.chain), use.call[0], ", ".join(use.call[1]) or "no keywords",
                verdicts[0][1]))
    assert checked > 50
    assert mismatched == [], "\n".join(mismatched)
    verified("API surface", "%d calls of TF 1.15 Python functions fit their 1.15 signatures" % checked)


def test_no_proto_field_newer_than_tf115(tf115_tree, uses, verified):
    older = ProtoSchema.load(tf115_tree.core)
    newer = ProtoSchema.load(Path(tf.__file__).parent)
    roots = set()
    for use in uses:
        for index, part in enumerate(use.chain):
            if part.endswith("_pb2"):
                roots |= newer.modules.get(".".join(use.chain[1:index + 1]), set())
            roots |= newer.top_level(part)
    added = newer.added_since(older, roots)
    assert "auto_mixed_precision_cpu" in added  # RewriterConfig's, newer than 1.15
    found = ["%s:%d: .%s is %s, which TensorFlow 1.15 does not have" % (
        path.relative_to(ROOT), line, name, added[name])
        for path in SOURCES for name, line in attribute_names(path).items() if name in added]
    assert found == [], "\n".join(found)
    verified("API surface", "no field or enum value of the %d proto types the sources reach is newer "
             "than TF 1.15 (%d such names exist in TF %s)" % (len(newer.reachable(roots)), len(added),
                                                                tf.__version__))
