"""What ``tf.sysconfig`` says on a TensorFlow 1.15 install, computed by 1.15's own code.

``tf115_build(tree, tf115) -> fused_op.build.TensorFlowBuild``: the version and the compile
and link flags that ``tf.sysconfig.get_compile_flags()`` / ``get_link_flags()`` return on a
1.15 machine, so ``build_libraries(tensorflow=...)`` runs the commands it would run there.

1.15's ``sysconfig.py`` cannot be imported here (it imports TensorFlow 1.15's Python
module). Its functions are executed from its source instead, with the values its imports
would have supplied: ``CXX11_ABI_FLAG`` and ``MONOLITHIC_BUILD`` as 1.15's framework library
reports them (``tf_cxx11_abi_flag()``, ``tf_monolithic_build()``), ``VERSION`` as
``TF_Version()``, and ``tensorflow_core`` at the unpacked tree.
"""
from __future__ import annotations

import ast
import sys
import types

from tfamp_rewrite.fused_op.build import TensorFlowBuild


def _sysconfig_functions(source: str, filename: str, namespace: dict) -> dict:
    """Executes ``source`` without its ``tensorflow`` imports, in ``namespace``."""
    module = ast.parse(source, filename)
    module.body = [statement for statement in module.body
                   if not (isinstance(statement, ast.ImportFrom)
                           and (statement.module or "").startswith("tensorflow"))]
    exec(compile(module, filename, "exec"), namespace)  # noqa: S102 - TensorFlow's own code
    return namespace


def tf115_build(tree, tf115) -> TensorFlowBuild:
    """The TensorFlowBuild of the 1.15 in ``tree``, whose runtime ``tf115`` is running."""
    facts = tf115.build_facts()
    version = tf115.version()
    path = tree.core / "python" / "platform" / "sysconfig.py"
    namespace = _sysconfig_functions(path.read_text(), str(path), {
        "__name__": "tf115_sysconfig", "_CXX11_ABI_FLAG": facts["cxx11_abi_flag"],
        "_MONOLITHIC_BUILD": facts["monolithic_build"], "_VERSION": version,
        "tf_export": lambda *names, **kwargs: (lambda function: function),
    })
    fake = types.ModuleType("tensorflow_core")
    fake.__file__ = str(tree.core / "__init__.py")
    saved = sys.modules.get("tensorflow_core")
    sys.modules["tensorflow_core"] = fake  # what get_include() / get_lib() import
    try:
        return TensorFlowBuild(version, namespace["get_compile_flags"](),
                               namespace["get_link_flags"]())
    finally:
        if saved is None:
            del sys.modules["tensorflow_core"]
        else:
            sys.modules["tensorflow_core"] = saved
