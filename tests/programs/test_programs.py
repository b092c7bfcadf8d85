"""TF1-era training programs train the same in mixed precision as in float32.

Each program of the corpus (``tests/support/program_corpus.py``) runs unchanged three ways
at seed 0 -- fp32, zero-code AMP (``TF_ENABLE_AUTO_MIXED_PRECISION=1``) and ``tfamp-run`` --
with the rewrite on the CPU emulating a Tensor Core GPU's numerics.  Each run must finish,
the AMP runs must log a rewrite that converted nodes, and both AMP final losses must be
within the program's tolerance of fp32's (its measured seed-to-seed spread, see the corpus).
The programs must also build what they stand for (their op types under TF1 behaviour), and
zero-code AMP must put loss scaling on each of them.
"""
import pytest
from program_corpus import (
    CORPUS,
    comparison_problems,
    describe_problems,
    finish,
    graph_facts,
    program,
    relative_difference,
    run_modes,
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
def zero_code_graphs():
    """Op types and loss-scale variables of each program's session graphs: two steps with
    ``TF_ENABLE_AUTO_MIXED_PRECISION=1``, all programs in one process.  (The sessions'
    graphs are the programs' own, which AMP leaves as they are but for loss scaling.)"""
    return graph_facts(_available_names(), mode="zero_code")


def test_corpus_has_at_least_ten_programs():
    assert len(CORPUS) >= 10
    assert len(set(IDS)) == len(CORPUS)


@pytest.mark.parametrize("entry", CORPUS, ids=IDS)
def test_program_trains_alike_in_fp32_and_amp(entry):
    _skip_if_unavailable(entry)
    results = run_modes(entry)  # the three runs overlap: two cores, much of each is start-up
    problems = comparison_problems(entry, results)
    assert not problems, "\n".join(problems) + "\n" + describe_problems(results)


@pytest.mark.parametrize("entry", CORPUS, ids=IDS)
def test_program_builds_the_tf1_pattern_it_stands_for(entry, zero_code_graphs):
    _skip_if_unavailable(entry)
    facts = zero_code_graphs[entry.name]
    op_types = set(facts["op_types"])
    assert set(entry.exercises) <= op_types, "missing: %s" % sorted(set(entry.exercises) - op_types)
    # The program's variables are TF1 reference variables (TensorFlow 2's tf.Variable would be a
    # resource variable even under TF1 behaviour); only the loss scale's own may be resources.
    programs_resources = [name for name in facts["resource_variables"] if "loss_scale" not in name]
    assert not programs_resources


@pytest.mark.parametrize("entry", CORPUS, ids=IDS)
def test_zero_code_amp_scales_the_loss_of_each_optimizer(entry, zero_code_graphs):
    _skip_if_unavailable(entry)
    variables = zero_code_graphs[entry.name]["loss_scale_variables"]
    scales = [name for name in variables if name.endswith("/current_loss_scale")]
    assert len(scales) == entry.optimizers, variables


def test_the_vae_heals_under_the_newest_pass():
    """TensorFlow >= 2.20's pass (compat latest: infer-after-allow for float16) runs the VAE's
    ``log(1e-10 + p)`` and the Reciprocal of its gradient in float16; p < 1.5e-5 overflows the
    Reciprocal, and later the loss turns nan.  Unchanged and unhelped, every step would be
    skipped from then on; the session names the tensors, keeps them float32 and trains on."""
    entry = program("vae")
    runs = [start(entry, "fp32"), start(entry, "zero_code", extra_env={"TFAMP_REWRITE_COMPAT": "latest"})]
    fp32, amp = (finish(run) for run in runs)
    assert fp32.problem() is None and amp.problem() is None, amp.tail
    assert amp.compat == "latest" and amp.heals >= 1, amp.tail
    warnings = [m for m in amp.product_messages if "training steps are being skipped" in m]
    assert "'gradients/Log_grad/Reciprocal' (Reciprocal, infer list)" in warnings[0], warnings
    assert relative_difference(amp.final_loss, fp32.final_loss) <= entry.tolerance, (fp32.curve, amp.curve)
