"""``--compat auto``, the default: the installed TensorFlow's pass, named in the report."""
import json

import pytest
import saved_graph_models as models
import tensorflow as tf
from compat_graphs import vae_reconstruction_graph

from tfamp_rewrite.graph_rewrite.compat import compat_of_tensorflow
from tfamp_rewrite.saved_graph.cli import main


def _convert(capsys, tmp_path, *options):
    """``tfamp-rewrite convert`` with exactly ``options`` (cli_helpers would pin a compat)."""
    source = models.write_frozen(vae_reconstruction_graph(), str(tmp_path / "vae.pb"))
    report = tmp_path / ("report%d.json" % len(list(tmp_path.glob("report*.json"))))
    # --out-of-range clamp: 1e-10 underflows float16, and by default its reader would stay float32
    code = main(["convert", source, str(tmp_path / (report.stem + ".pb")), "--outputs", "grad",
                 "--out-of-range", "clamp", "--report", str(report), *options])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(report.read_text()), out


@pytest.mark.parametrize("options", [(), ("--compat", "auto")])
def test_the_default_is_the_installed_tensorflows_pass(capsys, tmp_path, options):
    report, out = _convert(capsys, tmp_path, *options)
    running = compat_of_tensorflow(tf.__version__)
    assert report["rewrite"]["compat"] == running
    assert "compat=%s" % running in out
    reciprocal = next(d for d in report["rewrite"]["decisions"] if d["name"] == "reciprocal")
    assert reciprocal["converted"] == (running == "latest")


def test_an_explicit_compat_is_followed(capsys, tmp_path):
    report, _ = _convert(capsys, tmp_path, "--compat", "latest")
    assert report["rewrite"]["compat"] == "latest"
    assert next(d for d in report["rewrite"]["decisions"] if d["name"] == "reciprocal")["converted"]
