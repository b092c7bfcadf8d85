"""Writing converted saved graphs: atomically, and never over the input.

``check_output`` refuses a bad OUTPUT before any work is done (it is the input, lies
inside it or holds it, exists without ``--overwrite`` or is a directory that is no
SavedModel, has the wrong extension, its directory is missing or read-only);
``check_side_output`` refuses a ``--report``/``--dot`` path that would land on the input,
the OUTPUT or another side output.  ``stage_output`` writes the complete result into a
temporary file or directory in OUTPUT's directory; ``Staged.commit()`` gives it the mode a
new file gets under the umask and renames it into place (``os.replace`` for files; for a
directory with ``--overwrite``: old -> backup, new -> OUTPUT, backup removed) and
``Staged.discard()`` removes it, so an error leaves no partial output.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Callable, Optional

from google.protobuf import text_format
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from ..errors import ConversionError
from .formats import GRAPH_EXTENSIONS, GRAPHDEF, METAGRAPH, SAVED_MODEL_FILES, SAVEDMODEL, SavedGraph


def _within(path: str, other: str) -> bool:
    """True if ``path`` is ``other`` or lies inside it (links resolved)."""
    path, other = os.path.realpath(path), os.path.realpath(other)
    return path == other or path.startswith(other.rstrip(os.sep) + os.sep)


def check_output(saved: SavedGraph, output: str, overwrite: bool) -> None:
    """Raises ConversionError if ``output`` cannot receive the converted ``saved``."""
    if _within(output, saved.path):
        raise ConversionError("OUTPUT %s is (inside) the INPUT" % output,
                              "Choose another OUTPUT path; the input is never modified")
    if _within(saved.path, output):
        raise ConversionError("OUTPUT %s holds the INPUT %s" % (output, saved.path),
                              "Choose an OUTPUT path outside it; the input is never modified")
    extension = os.path.splitext(output)[1].lower()
    if saved.kind == SAVEDMODEL and extension in GRAPH_EXTENSIONS:
        raise ConversionError("OUTPUT %s has a %s extension but INPUT is a SavedModel" % (output, extension),
                              "Give a directory path for the converted SavedModel")
    if saved.kind != SAVEDMODEL and GRAPH_EXTENSIONS.get(extension, ("",))[0] != saved.kind:
        wanted = ".pb or .pbtxt" if saved.kind == GRAPHDEF else ".meta"
        raise ConversionError("OUTPUT %s does not end in %s but INPUT is a %s" % (output, wanted, saved.kind),
                              "Name the output like the input (%s)" % wanted)
    wants_directory = saved.kind == SAVEDMODEL
    if os.path.lexists(output):
        if not overwrite:
            raise ConversionError("OUTPUT %s already exists" % output,
                                  "Pass --overwrite to replace it, or choose another path")
        if os.path.isdir(output) != wants_directory:
            raise ConversionError("OUTPUT %s is a %s" % (output, "file" if wants_directory else "directory"),
                                  "Choose another path; --overwrite only replaces a %s" % (
                                      "SavedModel directory" if wants_directory else "file"))
        if wants_directory and not _is_saved_model(output):
            raise ConversionError("OUTPUT %s is a directory that holds no SavedModel" % output,
                                  "Choose another path; --overwrite only replaces a SavedModel directory")
    check_writable_directory(output, "OUTPUT")


def _is_saved_model(directory: str) -> bool:
    return any(os.path.isfile(os.path.join(directory, name)) for name, _ in SAVED_MODEL_FILES)


def check_side_output(path: str, role: str, saved: SavedGraph, taken) -> None:
    """Raises ConversionError if side output ``path`` (``role``: --report, --dot) would write
    over or into the input, or a path in ``taken`` ({path: its role}: OUTPUT, another side
    output), or is not writable."""
    if _within(path, saved.path) or _within(saved.path, path):
        raise ConversionError("%s %s would write over the INPUT %s" % (role, path, saved.path),
                              "Choose another %s path; the input is never modified" % role)
    for other, other_role in taken.items():
        if _within(path, other) or _within(other, path):
            raise ConversionError("%s %s would write over %s %s" % (role, path, other_role, other),
                                  "Give %s a path of its own" % role)
    check_writable_directory(path, role)


def check_writable_directory(path: str, role: str) -> None:
    """Raises ConversionError unless ``path``'s directory exists and is writable."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise ConversionError("the directory of %s %s, %s, %s" % (role, path, directory, what),
                              "Create it first (mkdir -p) or choose another path")
    try:  # os.access says yes to root even on a read-only file system: try it
        handle, probe = tempfile.mkstemp(prefix=".tfamp-rewrite-probe-", dir=directory)
        os.close(handle)
        os.remove(probe)
    except OSError as error:
        raise ConversionError("cannot write to %s, the directory of %s %s (%s)" % (
            directory, role, path, error.strerror), "Choose a writable directory") from None


class Staged:
    """A complete output in a temporary path beside its destination (see module docstring)."""

    def __init__(self, temporary: str, destination: str, is_directory: bool):
        self.temporary = temporary
        self.destination = destination
        self.is_directory = is_directory

    def commit(self) -> None:
        os.chmod(self.temporary, new_file_mode(self.is_directory))
        if not self.is_directory:
            os.replace(self.temporary, self.destination)
            return
        backup = None
        if os.path.lexists(self.destination):
            backup = _temporary_path(self.destination, directory=True)
            os.rmdir(backup)
            os.rename(self.destination, backup)
        os.rename(self.temporary, self.destination)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)

    def discard(self) -> None:
        if self.is_directory:
            shutil.rmtree(self.temporary, ignore_errors=True)
        elif os.path.lexists(self.temporary):
            os.remove(self.temporary)


def stage_output(saved: SavedGraph, graph_def, output: str,
                 edit_meta_graph: Optional[Callable[[object], None]] = None,
                 stripped_default_attrs: bool = False) -> Staged:
    """Writes ``saved`` with its graph replaced by ``graph_def`` to a temporary path.

    ``edit_meta_graph(meta_graph)`` may adjust the copied MetaGraphDef (signatures) first.
    ``stripped_default_attrs``: ``graph_def`` leaves default-valued attributes out (compat
    tf1.15); a MetaGraph says so, as TensorFlow's own exports with ``strip_default_attrs`` do.
    """
    if saved.kind == GRAPHDEF:
        return _stage_file(output, _serialize(graph_def, output.lower().endswith(".pbtxt")))
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.CopyFrom(saved.meta_graph)
    meta_graph.graph_def.CopyFrom(graph_def)
    if stripped_default_attrs:
        meta_graph.meta_info_def.stripped_default_attrs = True
    _complete_op_list(meta_graph)
    if edit_meta_graph is not None:
        edit_meta_graph(meta_graph)
    if saved.kind == METAGRAPH:
        return _stage_file(output, _serialize(meta_graph, saved.text))
    saved_model = saved_model_pb2.SavedModel()
    saved_model.CopyFrom(saved.saved_model)
    saved_model.meta_graphs[saved.meta_graph_index].CopyFrom(meta_graph)
    return _stage_directory(saved, output, _serialize(saved_model, saved.text))


def _serialize(message, text: bool) -> bytes:
    """The bytes of ``message``, the same for the same message on every run.

    Binary protobuf leaves the order of map entries (a NodeDef's ``attr``, a SavedModel's
    ``signature_def``) to the implementation, and protobuf 3.20's differs from run to run;
    ``deterministic=True`` sorts them, so converting the same input twice writes the same bytes.
    """
    if text:
        return text_format.MessageToString(message).encode("utf-8")
    return message.SerializeToString(deterministic=True)


def _complete_op_list(meta_graph) -> None:
    """Adds the OpDefs of op types the rewrite introduced (Cast) to a non-empty stripped_op_list."""
    from ..tf_compat import lookup_op_def

    op_list = meta_graph.meta_info_def.stripped_op_list
    if not op_list.op:
        return
    known = {op.name for op in op_list.op}
    for op_type in sorted({node.op for node in meta_graph.graph_def.node} - known):
        op_def = lookup_op_def(op_type)
        if op_def is not None:
            added = op_list.op.add()
            added.CopyFrom(op_def)
            added.ClearField("summary")
            added.ClearField("description")


def new_file_mode(directory: bool) -> int:
    """The mode ``open()`` or ``mkdir`` would give a new file or directory under this umask
    (a temporary one is private, 0600/0700, until it is renamed into place)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def _temporary_path(destination: str, directory: bool) -> str:
    parent = os.path.dirname(os.path.abspath(destination))
    prefix = ".%s.tmp-" % os.path.basename(os.path.abspath(destination))
    try:
        if directory:
            return tempfile.mkdtemp(prefix=prefix, dir=parent)
        handle, path = tempfile.mkstemp(prefix=prefix, dir=parent)
        os.close(handle)
        return path
    except OSError as error:
        raise ConversionError("cannot write to %s (%s)" % (parent, error.strerror),
                              "Choose an OUTPUT in a writable directory") from None


def write_file_atomically(path: str, data: bytes) -> None:
    """Writes ``data`` to a temporary file beside ``path``, then renames it to ``path``."""
    staged = _stage_file(path, data)
    with _discarded_on_error(staged):
        staged.commit()


@contextlib.contextmanager
def _discarded_on_error(staged: Staged):
    """Removes ``staged`` and raises ConversionError if the block fails to write."""
    try:
        yield
    except OSError as error:
        staged.discard()
        raise ConversionError("cannot write %s (%s)" % (staged.destination, error.strerror),
                              "Free some space or choose another path") from None


def _stage_file(output: str, data: bytes) -> Staged:
    staged = Staged(_temporary_path(output, directory=False), output, is_directory=False)
    with _discarded_on_error(staged), open(staged.temporary, "wb") as handle:
        handle.write(data)
    return staged


def _stage_directory(saved: SavedGraph, output: str, graph_bytes: bytes) -> Staged:
    staged = Staged(_temporary_path(output, directory=True), output, is_directory=True)
    with _discarded_on_error(staged):
        for entry in os.listdir(saved.path):
            source, target = os.path.join(saved.path, entry), os.path.join(staged.temporary, entry)
            if entry == os.path.basename(saved.graph_file) or entry == "fingerprint.pb":
                continue  # rewritten below; the fingerprint would no longer match the graph
            if os.path.isdir(source):
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        with open(os.path.join(staged.temporary, os.path.basename(saved.graph_file)), "wb") as handle:
            handle.write(graph_bytes)
    return staged
