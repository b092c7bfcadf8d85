"""TF1-era training programs train the same in mixed precision as in float32.

Each program of the corpus (``tests/support/program_corpus.py``) runs unchanged three ways
at seed 0 -- fp32, zero-code AMP (``TF_ENABLE_AUTO_MIXED_PRECISION=1``) and ``tfamp-run`` --
with the rewrite on the CPU emulating a Tensor Core GPU's numerics.  Zero-code AMP runs each
program in a process of its own, as users run it; the fp32 references and ``tfamp-run`` run
the corpus as one batch each (a process start costs more than most programs' training).
Each run must finish, the AMP runs must log a rewrite that converted nodes, and both AMP
final losses must be within the program's tolerance of fp32's (its measured seed-to-seed
spread, see the corpus).  The programs must also build what they stand for (their op types
under TF1 behaviour), and AMP must put loss scaling on each of their optimizers.
"""
import pytest
from program_corpus import (
    CORPUS,
    comparison_problems,
    describe_problems,
    finish,
    program,
    relative_difference,
    run_batches,
    run_program,
    start,
    unavailable_reason,
)

IDS = [entry.name for entry in CORPUS]


def _skip_if_unavailable(entry):
    reason = unavailable_reason(entry)
    if reason:
        pytest.skip(reason)


def _available_names():
    return [entry.name for entry in CORPUS if not unavailable_reason(entry)]


@pytest.fixture(scope="module")
def batches():
    """``{"fp32": {name: RunResult}, "tfamp_run": {...}}``: the available programs run one after
    the other in one process per mode, the two processes side by side.  The ``tfamp-run``
    results also hold the op types and loss-scale variables of each program's session graphs
    (the programs' own graphs, which AMP leaves as they are but for loss scaling)."""
    return run_batches(_available_names())


def test_corpus_has_at_least_ten_programs():
    assert len(CORPUS) >= 10
    assert len(set(IDS)) == len(CORPUS)


@pytest.mark.parametrize("entry", CORPUS, ids=IDS)
def test_program_trains_alike_in_fp32_and_amp(entry, batches):
    _skip_if_unavailable(entry)
    results = {"fp32": batches["fp32"][entry.name], "zero_code": run_program(entry, "zero_code"),
               "tfamp_run": batches["tfamp_run"][entry.name]}
    problems = comparison_problems(entry, results)
    assert not problems, "\n".join(problems) + "\n" + describe_problems(results)


@pytest.mark.parametrize("entry", CORPUS, ids=IDS)
def test_program_builds_the_tf1_pattern_it_stands_for(entry, batches):
    _skip_if_unavailable(entry)
    facts = batches["tfamp_run"][entry.name].graph
    op_types = set(facts["op_types"])
    assert set(entry.exercises) <= op_types, "missing: %s" % sorted(set(entry.exercises) - op_types)
    # The program's variables are TF1 reference variables (TensorFlow 2's tf.Variable would be a
    # resource variable even under TF1 behaviour); only the loss scale's own may be resources,
    # and a Keras program's (Keras makes resource variables in TF 1.15 too).
    programs_resources = [name for name in facts["resource_variables"] if "loss_scale" not in name]
    assert bool(programs_resources) == entry.resource_variables, programs_resources


@pytest.mark.parametrize("entry", CORPUS, ids=IDS)
def test_amp_scales_the_loss_of_each_optimizer(entry, batches):
    _skip_if_unavailable(entry)
    variables = batches["tfamp_run"][entry.name].graph["loss_scale_variables"]
    scales = [name for name in variables if name.endswith("/current_loss_scale")]
    assert len(scales) == entry.optimizers, variables


def test_the_vae_heals_under_the_newest_pass(batches):
    """TensorFlow >= 2.20's pass (compat latest: infer-after-allow for float16) runs the VAE's
    ``log(1e-10 + p)`` and the Reciprocal of its gradient in float16; p < 1.5e-5 overflows the
    Reciprocal, and later the loss turns nan.  Unchanged and unhelped, every step would be
    skipped from then on; the session names the tensors, keeps them float32 and trains on."""
    entry = program("vae")
    fp32 = batches["fp32"]["vae"]
    amp = finish(start(entry, "zero_code", extra_env={"TFAMP_REWRITE_COMPAT": "latest"}))
    assert fp32.problem() is None and amp.problem() is None, amp.tail
    assert amp.compat == "latest" and amp.heals >= 1, amp.tail
    warnings = [m for m in amp.product_messages if "training steps are being skipped" in m]
    assert "'gradients/Log_grad/Reciprocal' (Reciprocal, infer list)" in warnings[0], warnings
    assert relative_difference(amp.final_loss, fp32.final_loss) <= entry.tolerance, (fp32.curve, amp.curve)
