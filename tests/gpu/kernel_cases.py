"""The correctness cases the harness runs on a GPU (or on the grid emulation).

They mirror the CPU kernel's tests (tests/fused_op/test_fused_op.py): random lists of 1-500
mixed-kind tensors of 0 to millions of elements, clean and with inf/nan at the first, last
and a random element; one special in a big tensor; every 16-bit pattern; the flag computed
on the inputs. Each runs in every buffer layout (aligned, misaligned, in place), and some
with small chunks and few tensors per launch, so that blocks span tensors and lists span
launches at sizes a GPU checks quickly. A list of 1000 small tensors runs in both launch
tables: one 32 KB launch (where CUDA passes it) and five 4 KB ones.
"""
from __future__ import annotations

import collections
import time
from typing import Callable, Iterator, List

import numpy as np
from device_check import LAYOUTS, SANITIZER_LAYOUTS, Layout, run_checked
from harness_library import KernelHarness
from model_gradients import model_sizes
from unscale_reference import (
    KINDS,
    HostTensor,
    every_pattern,
    random_sizes,
    random_tensors,
    with_specials,
)

Case = collections.namedtuple("Case", "name make_tensors inv_scale layout chunk_elements "
                                      "max_tensors")
SuiteResult = collections.namedtuple("SuiteResult", "cases launches elements failures seconds")

# (chunk_elements, max_tensors): the defaults, then blocks spanning many small tensors and
# lists spanning many launches; odd chunks start blocks off the 16-byte grid.
PLAN_SHAPES = ((None, None), (1000, 7), (777, 3), (64, 1))
# A list longer than a 4 KB launch table holds: one launch of the 32 KB table where CUDA
# passes one (the default plan), five of the 4 KB table (at most 203 tensors per launch).
LONG_LIST_TENSORS = 1000
LONG_LIST_SHAPES = ((None, None), (None, 203))
SCALES = (1.0, 0.5, 3.0, 1 / 3, 2.0**-10, 65536.0)


def _random_scale(rng) -> float:
    return float(np.float32(2.0 ** -int(rng.integers(0, 16)) * rng.uniform(0.5, 1.0)))


def _random_list(seed: int, count_limit: int, num_big: int, specials: bool,
                 largest_small: int = 40000) -> Callable:
    def make(rng):
        local = np.random.default_rng(seed)
        sizes = random_sizes(local, int(local.integers(1, count_limit + 1)), num_big=num_big,
                             largest_small=largest_small)
        tensors = random_tensors(local, sizes)
        return with_specials(local, tensors) if specials else tensors
    return make


def _one_special(position: str, big: int) -> Callable:
    def make(rng):
        local = np.random.default_rng(7)
        sizes = [0, 1, big + 1, 17, big - big // 6 + 3]
        tensors = random_tensors(local, sizes, kinds=("float32",))
        tensors[3] = HostTensor.from_values("float16", tensors[3].values())
        bits = tensors[2].bits.copy()
        index = {"first": 0, "last": bits.size - 1, "middle": bits.size // 2 + 12345}[position]
        bits[index] = 0x7FC00000  # nan
        tensors[2] = HostTensor("float32", bits)
        return tensors
    return make


def _long_list(specials: bool) -> Callable:
    def make(rng):
        local = np.random.default_rng(13)
        sizes = random_sizes(local, LONG_LIST_TENSORS, largest_small=300)
        tensors = random_tensors(local, sizes)
        return with_specials(local, tensors) if specials else tensors
    return make


def _flag_on_inputs(rng):
    overflows = HostTensor.from_values("float16", [60000.0, 1.0])  # finite in, inf out at 2x
    return [overflows, HostTensor.from_values("float32", [1.0, -2.0])]


def _model(name: str, kind: str) -> Callable:
    def make(rng):
        return random_tensors(np.random.default_rng(11), model_sizes(name), kinds=(kind,))
    return make


class SuiteSize(collections.namedtuple(
        "SuiteSize", "seeds largest_count largest_small big_tensors plan_shapes big scales "
                     "models unguarded")):
    """How much of the suite runs: random-list seeds, their longest list and largest small
    tensor, whether odd seeds add a 1-4 M element tensor, plan shapes, the big tensor of the
    one-special cases, scales of the 16-bit patterns, the models, unguarded layouts."""

    __slots__ = ()


FULL = SuiteSize(4, 500, 40000, True, PLAN_SHAPES, 3_000_000, SCALES,
                 ("resnet50", "bert_base"), False)
QUICK = SuiteSize(1, 200, 40000, False, PLAN_SHAPES[:2], 300_000, SCALES, (), False)
# compute-sanitizer runs kernels 10-100x slower and checks every access: small and unguarded.
SANITIZER = SuiteSize(1, 40, 4000, False, PLAN_SHAPES[:2], 300_000, SCALES[:2], (), True)
SUITES = {"full": FULL, "quick": QUICK, "sanitizer": SANITIZER}


def correctness_cases(size: SuiteSize = FULL) -> Iterator[Case]:
    """Every case of the suite ``size``, smaller ones first."""
    layouts: List[Layout] = list(SANITIZER_LAYOUTS if size.unguarded else LAYOUTS)
    for layout in layouts:
        for specials in (False, True):
            for seed in range(size.seeds):
                num_big = seed % 2 if size.big_tensors else 0
                name = f"random_list_{'specials' if specials else 'clean'}_{seed}"
                make = _random_list(seed, size.largest_count, num_big, specials,
                                    size.largest_small)
                for chunk, max_tensors in size.plan_shapes:
                    suffix = f"_chunk{chunk}_max{max_tensors}" if chunk else ""
                    yield Case(name + suffix, make, _random_scale(np.random.default_rng(seed)),
                               layout, chunk, max_tensors)
        for specials in (False, True):
            for chunk, max_tensors in LONG_LIST_SHAPES:
                yield Case(f"long_list_{'specials' if specials else 'clean'}_max{max_tensors}",
                           _long_list(specials), 0.375, layout, chunk, max_tensors)
        for position in ("first", "last", "middle"):
            yield Case(f"one_nan_{position}_in_a_big_tensor", _one_special(position, size.big),
                       0.125, layout, None, None)
        yield Case("flag_is_computed_on_the_inputs", _flag_on_inputs, 2.0, layout, None, None)
    for kind in ("float16", "bfloat16"):
        for scale in size.scales:
            yield Case(f"every_{kind}_pattern_scale_{scale:g}",
                       lambda rng, kind=kind: [every_pattern(kind)], scale, layouts[1], None, None)
    for model in size.models:
        for kind in KINDS:
            yield Case(f"{model}_{kind}", _model(model, kind), 2.0**-7, layouts[0], None, None)


def run_suite(harness: KernelHarness, cases, seed: int = 0, log=None) -> SuiteResult:
    """Runs every case; ``log(line)`` is told about each failure as it happens."""
    rng = np.random.default_rng(seed)
    count = launches = elements = 0
    failures = []
    start = time.perf_counter()
    for case in cases:
        tensors = case.make_tensors(rng)
        result = run_checked(harness, tensors, case.inv_scale, case.layout, rng,
                             case.chunk_elements, case.max_tensors)
        count += 1
        launches += result.launches
        elements += sum(t.size for t in tensors)
        if result.problems:
            failure = f"{case.name} [{case.layout.name}]: " + " | ".join(result.problems)
            failures.append(failure)
            if log:
                log("  FAIL " + failure)
    return SuiteResult(count, launches, elements, failures, time.perf_counter() - start)
