"""Mutation fuzzing of ``tfamp-rewrite convert``: damaged saved graphs in, and what must hold.

    python tests/support/cli_fuzz.py [--cases N] [--seed S] [--formats pb,pbtxt,...]

Each case copies a small valid model, damages one file of it (bit flips, a truncation, a
splice of its own bytes; text files also get line and token edits; a third of the graph
files get one structural edit instead -- a node's attr dropped, emptied or given a random
value, an input dropped, duplicated, re-pointed or malformed, an op name changed by one letter
or to an unregistered custom op's --, which parses, so it reaches the checks behind the
parser), runs the command line's ``main(argv)`` in this process, and checks the contract of
``tfamp-rewrite``:

* exit 0: OUTPUT exists and TensorFlow takes it -- ``import_graph_def`` (frozen graphs),
  ``import_meta_graph`` (MetaGraphs), ``saved_model.loader.load`` in a Session, variables
  restored (SavedModels; with soft placement, as a model placed on devices this machine
  lacks is loaded: a device name is no part of validity).  Ops TensorFlow does not register
  stay as they are (documented: float32 boundaries); for those the output must import with
  them stubbed (``import_check``);
* exit 2: exactly one stderr line ``tfamp-rewrite: ...`` that is not the internal-error
  backstop, and nothing written (OUTPUT absent, no temporary left beside it);
* never an exception out of ``main``, never another status, and the input never modified.

Formats (``FORMATS``): a frozen ``.pb``, a ``.pbtxt``, a MetaGraph ``.meta``, and a SavedModel
damaged in ``saved_model.pb`` or in ``variables/variables.index``.  ``make fuzz`` runs
20 000 cases; ``tests/saved_graph/test_cli_fuzz.py`` a few hundred per format.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import saved_graph_models as models  # noqa: E402
import tensorflow as tf  # noqa: E402
from cli_helpers import digest  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402
from tensorflow.core.protobuf import meta_graph_pb2  # noqa: E402

from tfamp_rewrite.saved_graph.cli import main  # noqa: E402
from tfamp_rewrite.saved_graph.import_check import stub_unknown_ops  # noqa: E402
from tfamp_rewrite.saved_graph.op_def_check import unknown_op_nodes  # noqa: E402

tf1 = tf.compat.v1
FORMATS = ("pb", "pbtxt", "meta", "saved_model", "variables_index")
_OP_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
INTERNAL_ERROR = "internal error"


@dataclass
class Seed:
    """A valid model: the INPUT to pass, the file inside it to damage, the OUTPUT name, and
    the message that file holds (None: not a protobuf of ours)."""

    input: str
    target: str
    output_name: str
    text: bool = False
    message: Optional[type] = None


@dataclass
class Tally:
    """Outcomes of one format's cases; ``failures`` are contract violations (with a sample each)."""

    cases: int = 0
    exit0: int = 0
    exit2: int = 0
    unregistered: int = 0                   # exit 0 with ops TensorFlow does not register
    failures: Dict[str, List[str]] = field(default_factory=lambda: collections.defaultdict(list))

    def failed(self, kind: str, detail: str) -> None:
        self.failures[kind].append(detail)

    @property
    def failure_count(self) -> int:
        return sum(len(items) for items in self.failures.values())


def build_seeds(root: str) -> Dict[str, Seed]:
    """One small valid model per format, written under ``root``."""
    os.makedirs(root, exist_ok=True)
    frozen = models.frozen_net(os.path.join(root, "net.pb"))
    text = models.frozen_net(os.path.join(root, "net.pbtxt"), text=True)
    meta_dir = os.path.join(root, "meta")
    os.makedirs(meta_dir)
    meta = models.meta_graph(meta_dir)
    saved_model = models.saved_model(os.path.join(root, "sm"))
    from tensorflow.core.protobuf import saved_model_pb2

    return {
        "pb": Seed(frozen, frozen, "out.pb", message=graph_pb2.GraphDef),
        "pbtxt": Seed(text, text, "out.pbtxt", text=True, message=graph_pb2.GraphDef),
        "meta": Seed(meta, meta, "out.meta", message=meta_graph_pb2.MetaGraphDef),
        "saved_model": Seed(saved_model, os.path.join(saved_model, "saved_model.pb"), "out_sm",
                            message=saved_model_pb2.SavedModel),
        "variables_index": Seed(saved_model, os.path.join(saved_model, "variables", "variables.index"),
                                "out_sm"),
    }


# -- damage ---------------------------------------------------------------------------
def mutate(data: bytes, rng: random.Random, text: bool = False) -> bytes:
    """``data`` with random damage: bit flips, a truncation, or a splice of its own bytes."""
    kinds = ["flip", "flip", "truncate", "splice"] + (["line", "token"] if text else [])
    kind = rng.choice(kinds)
    out = bytearray(data)
    if not out:
        return b"\x00"
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(out))
            out[position] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del out[rng.randrange(len(out)):]
    elif kind == "splice":
        start = rng.randrange(len(out))
        piece = bytes(out[start:start + rng.randint(1, 64)])
        at = rng.randrange(len(out) + 1)
        if rng.random() < 0.5:
            out[at:at] = piece                                  # insert a copy
        else:
            out[at:at + len(piece)] = piece                     # overwrite
        if rng.random() < 0.3:
            cut = rng.randrange(len(out))
            del out[cut:cut + rng.randint(1, 32)]
    elif kind == "line":
        lines = bytes(out).split(b"\n")
        i = rng.randrange(len(lines))
        action = rng.choice(("drop", "duplicate", "swap"))
        if action == "drop":
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        out = bytearray(b"\n".join(lines))
    else:  # token: replace one word by another word of the file
        words = bytes(out).split()
        if words:
            old, new = rng.choice(words), rng.choice(words)
            at = bytes(out).find(old, rng.randrange(len(out)))
            if at >= 0:
                out[at:at + len(old)] = new
    return bytes(out)


def mutate_structure(data: bytes, seed: Seed, rng: random.Random) -> bytes:
    """``data`` (a ``seed.message``) with one edit of one node that keeps it parseable."""
    message = seed.message()
    read_text_or_binary(message, data, seed.text)
    graphs = [message] if isinstance(message, graph_pb2.GraphDef) else (
        [message.graph_def] if isinstance(message, meta_graph_pb2.MetaGraphDef)
        else [meta.graph_def for meta in message.meta_graphs])
    graph = rng.choice(graphs)
    nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
    node = rng.choice(nodes)
    names = [other.name for other in graph.node]
    edit = rng.choice(["drop_attr", "empty_attr", "attr_value", "attr_value", "drop_input", "add_input",
                       "repoint_input", "bad_input", "op_letter", "custom_op"])
    keys = sorted(node.attr)
    if edit in ("drop_attr", "empty_attr", "attr_value") and keys:
        key = rng.choice(keys)
        if edit == "drop_attr":
            del node.attr[key]
        elif edit == "empty_attr":
            node.attr[key].Clear()
        else:
            _random_attr_value(node.attr[key], rng)
    elif edit == "drop_input" and node.input:
        del node.input[rng.randrange(len(node.input))]
    elif edit == "add_input" and names:
        node.input.insert(rng.randrange(len(node.input) + 1), rng.choice(names))
    elif edit == "repoint_input" and node.input and names:
        node.input[rng.randrange(len(node.input))] = "%s%s:%d" % (
            rng.choice(["", "", "^"]), rng.choice(names), rng.choice([0, 0, 1, 2, 7]))
    elif edit == "bad_input" and node.input and names:
        port = rng.choice([":x", ":-1", "::0", ":01", ":"])
        node.input[rng.randrange(len(node.input))] = rng.choice(names) + port
    elif edit == "custom_op":
        node.op = "Custom" + "".join(rng.choice("XYZQ") for _ in range(4))  # far from every registered op
    elif node.op:
        position = rng.randrange(len(node.op))
        node.op = node.op[:position] + rng.choice(_OP_LETTERS) + node.op[position + 1:]
    return text_format.MessageToString(message).encode() if seed.text else message.SerializeToString()


def _random_attr_value(value, rng: random.Random) -> None:
    kind = value.WhichOneof("value")
    if kind == "type":
        value.type = rng.choice([0, 1, 2, 3, 5, 9, 10, 14, 19, 20, 21, 101, 150])
    elif kind == "i":
        value.i = rng.choice([-3, -1, 0, 1, 2, 3, 7, 2 ** 31, 2 ** 40])
    elif kind == "f":
        value.f = rng.choice([0.0, -1.0, 1e30, float("nan")])
    elif kind == "b":
        value.b = not value.b
    elif kind == "s":
        value.s = rng.choice([b"", b"SAME", b"VALID", b"NCHW", b"NHWC", b"\xff\xfe", value.s[::-1]])
    elif kind == "shape":
        dim = value.shape.dim.add()
        dim.size = rng.choice([-7, -1, 0, 3])
    elif kind == "list":
        for field_name in ("i", "type", "s"):
            items = getattr(value.list, field_name)
            if len(items):
                del items[rng.randrange(len(items))]
                return
        value.list.i.append(rng.choice([-1, 0, 5]))
    elif kind == "tensor":
        tensor = value.tensor
        choice = rng.choice(["dtype", "dim", "content"])
        if choice == "dtype":
            tensor.dtype = rng.choice([0, 1, 3, 7, 9, 19])
        elif choice == "dim" and len(tensor.tensor_shape.dim):
            dims = tensor.tensor_shape.dim
            dims[rng.randrange(len(dims))].size = rng.choice([-1, 0, 2, 99])
        else:
            tensor.tensor_content = tensor.tensor_content[: len(tensor.tensor_content) // 2]
    else:
        value.i = 1  # a value of the wrong kind


def read_text_or_binary(message, data: bytes, text: bool):
    if text:
        text_format.Parse(data.decode("utf-8"), message)
    else:
        message.ParseFromString(data)
    return message


# -- one case -------------------------------------------------------------------------
def run_case(fmt: str, seed: Seed, rng: random.Random, workdir: str, tally: Tally) -> None:
    """Damages a copy of ``seed``, converts it, and records the outcome in ``tally``."""
    tally.cases += 1
    case_dir = tempfile.mkdtemp(prefix="case-", dir=workdir)
    try:
        source = _copy_seed(seed, case_dir)
        target = os.path.join(source, os.path.relpath(seed.target, seed.input)) if os.path.isdir(source) \
            else source
        with open(target, "rb") as handle:
            original = handle.read()
        if seed.message is not None and rng.random() < 1 / 3:
            damaged = mutate_structure(original, seed, rng)
        else:
            damaged = mutate(original, rng, seed.text)
        with open(target, "wb") as handle:
            handle.write(damaged)
        out_dir = os.path.join(case_dir, "out")
        os.makedirs(out_dir)
        output = os.path.join(out_dir, seed.output_name)
        before = digest(source)
        code, err = _convert(source, output)
        if code is None:
            tally.failed("traceback", err)
            return
        if digest(source) != before:
            tally.failed("input modified", "")
        if code == 2:
            tally.exit2 += 1
            _check_refusal(err, out_dir, tally)
        elif code == 0:
            tally.exit0 += 1
            _check_output(fmt, output, tally)
        else:
            tally.failed("exit %d" % code, err.strip()[-300:])
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)


def _copy_seed(seed: Seed, case_dir: str) -> str:
    destination = os.path.join(case_dir, os.path.basename(seed.input))
    if os.path.isdir(seed.input):
        shutil.copytree(seed.input, destination)
    else:
        shutil.copy(seed.input, destination)
    return destination


def _convert(source: str, output: str) -> Tuple[Optional[int], str]:
    """``(exit status, stderr)`` of ``main``; ``(None, traceback)`` if an exception escaped."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["convert", source, output, "--target", "cpu", "-q"])
    except BaseException as error:  # noqa: B036 - what escapes main is the finding
        return None, "%s: %s" % (type(error).__name__, str(error)[:300])
    return code, err.getvalue()


def _check_refusal(err: str, out_dir: str, tally: Tally) -> None:
    lines = err.strip().splitlines()
    if len(lines) != 1 or not lines[0].startswith("tfamp-rewrite: "):
        tally.failed("exit 2 without exactly one line", err.strip()[:500])
    elif INTERNAL_ERROR in lines[0]:
        tally.failed("internal error (an unexpected exception)", lines[0][:300])
    if os.listdir(out_dir):
        tally.failed("exit 2 but something was written", ", ".join(os.listdir(out_dir)))


def _check_output(fmt: str, output: str, tally: Tally) -> None:
    if not os.path.exists(output):
        tally.failed("exit 0 without OUTPUT", output)
        return
    try:
        if fmt in ("pb", "pbtxt"):
            graph_def = read_message(graph_pb2.GraphDef(), output, fmt == "pbtxt")
            if unknown_op_nodes(graph_def):
                tally.unregistered += 1
            import_graph(graph_def)
        elif fmt == "meta":
            meta_graph = read_message(meta_graph_pb2.MetaGraphDef(), output, False)
            if unknown_op_nodes(meta_graph.graph_def):
                tally.unregistered += 1
            import_meta(meta_graph)
        else:
            load_saved_model(output, tally)
    except Exception as error:  # TensorFlow's refusal of our output is the finding
        tally.failed("exit 0 but TensorFlow does not take the output", "%s: %s" % (
            type(error).__name__, " ".join(str(error).split())[:300]))


# -- what TensorFlow takes --------------------------------------------------------------
def read_message(message, path: str, text: bool):
    with open(path, "rb") as handle:
        return read_text_or_binary(message, handle.read(), text)


def import_graph(graph_def) -> None:
    with tf.Graph().as_default():
        tf1.import_graph_def(stub_unknown_ops(graph_def), name="")


def import_meta(meta_graph) -> None:
    stubbed = meta_graph_pb2.MetaGraphDef()
    stubbed.CopyFrom(meta_graph)
    stubbed.graph_def.CopyFrom(stub_unknown_ops(meta_graph.graph_def))
    with tf.Graph().as_default():
        tf1.train.import_meta_graph(stubbed)


def load_saved_model(path: str, tally: Tally) -> None:
    """Loads the SavedModel (restoring its variables); with unregistered ops: imports it stubbed."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = read_message(saved_model_pb2.SavedModel(), os.path.join(path, "saved_model.pb"), False)
    meta_graph = saved_model.meta_graphs[0]
    if unknown_op_nodes(meta_graph.graph_def):
        tally.unregistered += 1
        import_meta(meta_graph)
        return
    graph = tf.Graph()
    config = tf1.ConfigProto(allow_soft_placement=True)
    with graph.as_default(), tf1.Session(graph=graph, config=config) as session:
        tf1.saved_model.loader.load(session, list(meta_graph.meta_info_def.tags), path)


# -- many cases -------------------------------------------------------------------------
def run_fuzz(cases: Dict[str, int], seed: int, workdir: str) -> Dict[str, Tally]:
    """Runs ``cases[fmt]`` cases per format (seeded); returns a Tally per format."""
    seeds = build_seeds(os.path.join(workdir, "seeds"))
    tallies = {}
    for fmt, count in cases.items():
        rng = random.Random("%s-%d" % (fmt, seed))
        tally = tallies[fmt] = Tally()
        for _ in range(count):
            run_case(fmt, seeds[fmt], rng, workdir, tally)
    return tallies


def format_table(tallies: Dict[str, Tally], seconds: float) -> str:
    lines = ["%-16s %7s %7s %7s %13s %11s %9s" % ("format", "cases", "exit 0", "exit 2", "unregistered",
                                                   "tracebacks", "failures")]
    for fmt, tally in tallies.items():
        lines.append("%-16s %7d %7d %7d %13d %11d %9d" % (
            fmt, tally.cases, tally.exit0, tally.exit2, tally.unregistered,
            len(tally.failures.get("traceback", ())), tally.failure_count))
    total = sum(t.cases for t in tallies.values())
    lines.append("%d cases in %.0f s (%.1f ms each)" % (total, seconds, 1000 * seconds / max(total, 1)))
    for fmt, tally in tallies.items():
        for kind, items in tally.failures.items():
            lines.append("FAIL %s: %s (%d), e.g. %s" % (fmt, kind, len(items), items[0][:400]))
    return "\n".join(lines)


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20000,
                        help="cases in all, split evenly over the formats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args(argv)
    formats = [name for name in args.formats.split(",") if name]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error("unknown format(s) %s; choose from %s" % (", ".join(unknown), ", ".join(FORMATS)))
    per_format = {fmt: args.cases // len(formats) for fmt in formats}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfamp-fuzz-") as workdir:
        tallies = run_fuzz(per_format, args.seed, workdir)
    print(format_table(tallies, time.perf_counter() - start))
    return 1 if any(tally.failure_count for tally in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(_main())
