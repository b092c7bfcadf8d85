"""The fused op's CUDA kernel on a real GPU: correctness, conversions, bandwidth against the
peers, compute-sanitizer.

    python3 tests/gpu/gpu_check.py            # what `make test-gpu` runs
    python3 tests/gpu/gpu_check.py --emulate  # the same, on the CPU grid emulation
    python3 tests/gpu/gpu_check.py --build-only   # compile for sm_75..sm_90, no GPU needed

Needs the machine's python3 with numpy, and nvcc: no TensorFlow, no virtualenv, nothing
downloaded. PyTorch, where importable, is timed beside the kernel. Without a GPU it says so
and exits 0, having run nothing. With one it

1. builds a TensorFlow-free library from the op's own sources with nvcc for this GPU
   (harness_build.py), and prints the kernel's registers, spills and occupancy, and the
   conversion instructions in its PTX;
2. runs the correctness cases (kernel_cases.py: the CPU kernel's test lists, every 16-bit
   pattern, ResNet-50 and BERT-base gradients; aligned, misaligned and in-place buffers):
   outputs bit-identical to numpy's, all_finite right, every element written exactly once;
3. holds the device's conversion instructions, and the CPU kernel's portable conversions
   compiled for the device, to their numpy model, bit for bit (conversion_check.py);
4. prints the launch plan of ResNet-50, BERT-base and a 1000-tensor model: launches and
   blocks per call, tail waste;
5. times the kernel on those models (float32, float16 and bfloat16, out of place and in
   place) against a device-to-device cudaMemcpy of the same bytes (target >= 0.85x), PyTorch's
   fused unscale (target >= 1.2x) and a composite of per-tensor ops (peer_timing.py); then
   over chunk sizes on ResNet-50 and over launch sizes on the 1000-tensor model;
6. reruns a small correctness suite under compute-sanitizer memcheck, racecheck and
   initcheck (with --emulate: under AddressSanitizer instead).

Exit status: 0 when every correctness case, conversion and sanitizer run passed (timings
below a target are reported, not failed: timings are not pass/fail), 1 otherwise, 2 for bad
usage.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Only numpy-free modules at the top: the no-GPU path runs on a bare python3. The others are
# imported where they are used.
from cuda_driver import visible_gpu
from model_gradients import MODELS

PREFIX = "test-gpu:"
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck")
SANITIZER_ERROR_EXIT = 86
CHUNK_SWEEP = (4096, 8192, 16384, 32768, 65536)
# Tensors per launch: what each launch boundary costs. None: as many as one launch takes here
# (32 KB tables where CUDA passes them); 500: 32 KB tables too, but two launches of the
# 1000-tensor model (what a 32 KB boundary costs beside a 4 KB one); 203: a 4 KB table's
# capacity, every CUDA's.
LAUNCH_SWEEP = (None, 500, 203, 80, 40, 20)
KINDS = ("float32", "float16", "bfloat16")


def say(line: str = "") -> None:
    print(line, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", description="Check and time the fused op's CUDA kernel on a GPU.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--emulate", action="store_true",
                      help="run on the CPU grid emulation instead of a GPU (times are CPU times)")
    mode.add_argument("--build-only", action="store_true",
                      help="only compile the GPU harness (TFAMP_CUDA_ARCHS or sm_75..sm_90)")
    mode.add_argument("--sanitizer-pass", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--library", help="a harness library built before (by this script, "
                        "or harness_build.py) to use instead of building one")
    parser.add_argument("--suite", choices=("full", "quick", "sanitizer"), default=None,
                        help="correctness cases to run (default: full on a GPU, quick emulated)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed calls per measurement (default: 50 on a GPU, 1 emulated)")
    parser.add_argument("--models", default=None,
                        help="comma-separated models to time (default: all on a GPU, "
                             "resnet50 emulated)")
    parser.add_argument("--no-timing", action="store_true", help="skip the bandwidth tables")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="also build the kernel with these nvcc flags (e.g. "
                             "cg=\"-Xptxas -dlcm=cg\"), check it on the quick suite and "
                             "time it beside the default build over chunk sizes; repeatable")
    parser.add_argument("--no-sanitizers", action="store_true",
                        help="skip the compute-sanitizer (or AddressSanitizer) runs")
    args = parser.parse_args(argv)
    if args.sanitizer_pass and not args.library:
        parser.error("--sanitizer-pass needs --library")
    if args.iterations is not None and args.iterations < 1:
        parser.error("--iterations must be >= 1")
    for variant in args.variant:
        if "=" not in variant or not variant.split("=", 1)[0]:
            parser.error(f"--variant {variant!r}: write NAME=NVCC_FLAGS")
    if args.variant and (args.emulate or args.build_only):
        parser.error("--variant needs a GPU build (not --emulate or --build-only)")
    unknown = set((args.models or "").split(",")) - set(MODELS) - {""}
    if unknown:
        parser.error(f"--models: unknown {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(MODELS)}")
    return args


def build(args, gpu, workdir: Path):
    """(KernelHarness, toolchain or None), having said what was built."""
    import harness_build
    from harness_library import KernelHarness

    start = time.perf_counter()
    if args.library:
        harness = KernelHarness(args.library)
        if harness.emulated != args.emulate:
            raise harness_build.HarnessBuildError(
                f"{args.library} is the {'emulated' if harness.emulated else 'GPU'} build; "
                f"{'drop' if harness.emulated else 'add'} --emulate or build the other one")
        say(f"{PREFIX} using {args.library}")
        return harness, None if args.emulate else harness_build.find_toolchain()
    if args.emulate:
        library = harness_build.build_emulation(workdir)
        say(f"{PREFIX} built the CPU grid emulation of the kernel with "
            f"{os.environ.get('CXX', 'g++')} ({time.perf_counter() - start:.1f} s)")
        return KernelHarness(library), None
    toolchain = harness_build.find_toolchain()
    if toolchain is None:
        raise harness_build.HarnessBuildError(
            f"a GPU is visible ({gpu.name}) but no nvcc was found: set TFAMP_NVCC or CUDA_HOME, "
            "or put nvcc on PATH")
    archs = harness_build.archs_for_device(toolchain, gpu.major, gpu.minor)
    library, resources = harness_build.build_gpu(workdir, archs, toolchain)
    target = (f"sm_{archs[0]}" if archs[0] == 10 * gpu.major + gpu.minor else
              f"compute_{archs[0]} PTX (nvcc {toolchain.version} has no sm_{gpu.major}{gpu.minor})")
    say(f"{PREFIX} built {library.name} with nvcc {toolchain.version} for {target} "
        f"({time.perf_counter() - start:.1f} s)")
    say_resources(resources, harness_build.conversion_instructions(archs, toolchain))
    return KernelHarness(library), toolchain


def say_resources(resources, instructions) -> None:
    """Registers, spills and occupancy per architecture and launch-table size, and the PTX
    conversions each architecture's build uses."""
    import harness_build

    for (arch_name, slots), r in sorted(resources.items(),
                                        key=lambda item: (int(item[0][0][3:]), item[0][1])):
        arch = int(arch_name[3:])
        fit = harness_build.occupancy(arch, r.registers)
        resident = (f"{fit[0]} blocks of {harness_build.THREADS_PER_BLOCK} per SM, occupancy "
                    f"{100 * fit[1]:.0f}%" if fit else "occupancy: architecture not tabulated")
        say(f"  kernel on {arch_name}, {slots}-tensor launch table: {r.registers} registers per "
            f"thread, {r.spill_bytes} bytes spilled, {resident}")
    for arch, used in sorted(instructions.items()):
        conversions = ", ".join(f"{name} x{count}" for name, count in used.items()) or "-"
        say(f"  PTX conversions on sm_{arch}: {conversions}")


def check_correctness(harness, suite_name: str) -> bool:
    from kernel_cases import SUITES, correctness_cases, run_suite

    result = run_suite(harness, correctness_cases(SUITES[suite_name]), log=say)
    verdict = "all passed" if not result.failures else f"{len(result.failures)} FAILED"
    say(f"{PREFIX} correctness ({suite_name}): {result.cases} cases, {result.launches} launches, "
        f"{result.elements / 1e6:.1f} M elements in {result.seconds:.1f} s: {verdict}")
    return not result.failures


def planner_lines(harness):
    from kernel_bandwidth import table_cell
    from model_gradients import MODELS, model_sizes

    chunk = harness.chunk_elements
    lines = [f"{'model':<18} {'tensors':>7} {'elements':>12} {'launches':>8} {'table':>5} "
             f"{'blocks':>7} {'tail waste':>10}   (chunk {chunk} elements, <= "
             f"{harness.max_tensors} tensors per launch here)"]
    for name in MODELS:
        sizes = model_sizes(name)
        plan = harness.plan(sizes, [0] * len(sizes))
        waste = 1 - sum(sizes) / (plan.blocks * chunk)
        lines.append(f"{name:<18} {len(sizes):>7} {sum(sizes):>12} {plan.launches:>8} "
                     f"{table_cell(plan.table_bytes):>5} {plan.blocks:>7} {100 * waste:>9.2f}%")
    return lines


def check_conversions(harness, major: int) -> bool:
    from conversion_check import check_conversions as run_checks
    from conversion_check import format_results

    start = time.perf_counter()
    results = run_checks(harness, major)
    failed = sum(1 for r in results if r.mismatches)
    say(f"{PREFIX} conversions against their numpy model, bit for bit "
        f"({time.perf_counter() - start:.1f} s): "
        f"{'all equal' if not failed else f'{failed} FAILED'}")
    for line in format_results(results):
        say("  " + line)
    return not failed


def report_bandwidth(harness, models, iterations: int, emulated: bool) -> None:
    from kernel_bandwidth import format_rows, measure
    from model_gradients import model_sizes

    note = " (emulated: CPU times, not GPU figures)" if emulated else ""
    from peer_timing import load_torch, time_peers

    torch, why_no_peers = (None, "emulated run: no GPU to time peers on") if emulated else \
        load_torch()
    say(f"{PREFIX} bandwidth, {iterations} calls per measurement{note}:")
    if torch is None:
        say(f"  PyTorch and composite columns empty: {why_no_peers}")
    else:
        say(f"  peers: PyTorch {torch.__version__} _amp_foreach_non_finite_check_and_unscale_ "
            f"(in place only: out-of-place rows compare with it too) and the composite "
            f"(mul, isfinite, all per tensor, then all of the flags)")
    for line in format_rows([])[:2]:
        say("  " + line)
    for model in models:
        sizes = model_sizes(model)
        for kind in KINDS:
            for in_place in (False, True):
                label = f"{model} {kind}{' in place' if in_place else ''}"
                row = measure(harness, label, sizes, kind, iterations, in_place=in_place)
                if torch is not None:
                    peers = time_peers(torch, sizes, kind, iterations, in_place)
                    for name, value in zip(peers._fields, peers):
                        if isinstance(value, str):
                            say(f"  {label}: {name[:-3]} not timed: {value}")
                    row = row._replace(**{name: value if isinstance(value, float) else None
                                          for name, value in zip(peers._fields, peers)})
                say("  " + format_rows([row])[-1])
    if "resnet50" in models:
        say(f"{PREFIX} chunk size (elements per block), resnet50:")
        sweep = [measure(harness, f"resnet50 {kind} chunk {chunk}", model_sizes("resnet50"),
                         kind, iterations, chunk_elements=chunk)
                 for kind in KINDS for chunk in CHUNK_SWEEP]
        for line in format_rows(sweep):
            say("  " + line)
    launch_model = "transformer_1000" if "transformer_1000" in models else models[-1]
    say(f"{PREFIX} tensors per launch (what a launch boundary costs), {launch_model} float16:")
    most = harness.max_tensors
    limits = sorted({min(limit or most, most) for limit in LAUNCH_SWEEP}, reverse=True)
    sweep = [measure(harness, f"{launch_model} {limit} per launch", model_sizes(launch_model),
                     "float16", iterations, max_tensors=limit) for limit in limits]
    for line in format_rows(sweep):
        say("  " + line)


VARIANT_CHUNKS = (16384, 32768, 65536)


def compare_variants(args, gpu, toolchain, default_harness, workdir: Path) -> bool:
    """Each --variant build: the quick correctness suite, then its time on every model and
    dtype (out of place) over VARIANT_CHUNKS, beside the default build's, in one table."""
    import harness_build
    from harness_library import KernelHarness
    from kernel_bandwidth import format_rows, measure
    from model_gradients import model_sizes

    archs = harness_build.archs_for_device(toolchain, gpu.major, gpu.minor)
    builds = [("default", default_harness)]
    ok = True
    for variant in args.variant:
        name, flags = variant.split("=", 1)
        library, resources = harness_build.build_gpu(workdir / f"variant-{name}", archs, toolchain,
                                                     flags.split())
        say(f"{PREFIX} variant {name} ({flags}):")
        say_resources(resources, {})
        harness = KernelHarness(library)
        ok &= check_correctness(harness, "quick")
        builds.append((name, harness))
    models = (args.models or "resnet50,bert_base,transformer_1000").split(",")
    iterations = args.iterations or 50
    say(f"{PREFIX} variants side by side, out of place, {iterations} calls per measurement:")
    for line in format_rows([])[:2]:
        say("  " + line)
    for model in models:
        for kind in KINDS:
            for chunk in VARIANT_CHUNKS:
                for name, harness in builds:
                    row = measure(harness, f"{model} {kind} {name} {chunk}", model_sizes(model),
                                  kind, iterations, chunk_elements=chunk)
                    say("  " + format_rows([row])[-1])
    return ok



def run_sanitizers(args, harness, toolchain, workdir: Path) -> bool:
    """Each tool over the sanitizer suite in a child process; True when all are clean."""
    import harness_build

    child = [sys.executable, str(Path(__file__).resolve()), "--sanitizer-pass"]
    runs = []
    if args.emulate:
        library = harness_build.build_emulation(workdir / "asan", address_sanitizer=True)
        runtime = subprocess.run([os.environ.get("CXX", "g++"), "-print-file-name=libasan.so"],
                                 stdout=subprocess.PIPE, text=True).stdout.strip()
        env = dict(os.environ, LD_PRELOAD=runtime, ASAN_OPTIONS="detect_leaks=0")
        runs.append(("AddressSanitizer", child + ["--library", str(library)], env))
    else:
        sanitizer = harness_build.find_compute_sanitizer(toolchain.nvcc if toolchain else None)
        if sanitizer is None:
            say(f"{PREFIX} FAIL: compute-sanitizer not found (looked beside nvcc, in $CUDA_HOME, "
                "on PATH, in /usr/local/cuda); install it or pass --no-sanitizers")
            return False
        for tool in SANITIZER_TOOLS:
            extra = ["--leak-check", "full"] if tool == "memcheck" else []
            argv = [sanitizer, "--tool", tool, *extra, "--error-exitcode",
                    str(SANITIZER_ERROR_EXIT), "--print-limit", "20",
                    *child, "--library", str(harness.path)]
            runs.append((f"compute-sanitizer --tool {tool}", argv, dict(os.environ)))
    clean = True
    for name, argv, env in runs:
        start = time.perf_counter()
        result = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        lines = result.stdout.strip().splitlines()
        summary = next((line for line in reversed(lines) if "SUMMARY" in line),
                       lines[-1] if lines else "(no output)")
        ok = result.returncode == 0
        clean &= ok
        say(f"{PREFIX} {name}: {'clean' if ok else 'FAILED'} (exit {result.returncode}, "
            f"{time.perf_counter() - start:.0f} s): {summary.strip()}")
        if not ok:
            for line in lines[-40:]:
                say("    " + line)
    return clean


def sanitizer_pass(library: str) -> int:
    """The child run: the sanitizer suite on an already built library."""
    from harness_library import KernelHarness
    from kernel_cases import SANITIZER, correctness_cases, run_suite

    harness = KernelHarness(library)
    result = run_suite(harness, correctness_cases(SANITIZER), log=say)
    harness.reset()  # memcheck's leak check runs here
    say(f"sanitizer suite: {result.cases} cases, {result.launches} launches, "
        f"{len(result.failures)} failed")
    return 1 if result.failures else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.sanitizer_pass:
        return sanitizer_pass(args.library)
    gpu = None
    if not (args.emulate or args.build_only):
        gpu, why_not = visible_gpu()
        if gpu is None:
            say(f"{PREFIX} no CUDA GPU visible ({why_not}); nothing run")
            return 0
        say(f"{PREFIX} {gpu.name} (sm_{gpu.major}{gpu.minor}), {gpu.count} device(s) visible")
    import harness_build
    from harness_library import HarnessError

    with tempfile.TemporaryDirectory(prefix="tfamp-gpu-check-") as scratch:
        workdir = Path(scratch)
        try:
            if args.build_only:
                return build_only(workdir)
            harness, toolchain = build(args, gpu, workdir)
        except (harness_build.HarnessBuildError, HarnessError) as error:
            say(f"{PREFIX} FAIL: no harness to run: {error}")
            return 1
        from unscale_reference import require_ieee_denormals

        require_ieee_denormals()
        info = harness.device()
        say(f"{PREFIX} device: {info.name}, sm_{info.major}{info.minor}, "
            f"{info.multiprocessors} multiprocessors, {info.memory_bytes / 2**30:.1f} GiB")
        if args.emulate:
            harness.set_thread_order("shuffled", seed=1)
        ok = check_correctness(harness, args.suite or ("quick" if args.emulate else "full"))
        ok &= check_conversions(harness, info.major)
        say(f"{PREFIX} launch plan:")
        for line in planner_lines(harness):
            say("  " + line)
        if not args.no_timing:
            models = (args.models or ("resnet50" if args.emulate else
                                      "resnet50,bert_base,transformer_1000")).split(",")
            report_bandwidth(harness, models, args.iterations or (1 if args.emulate else 50),
                             args.emulate)
        if args.variant:
            ok &= compare_variants(args, gpu, toolchain, harness, workdir)
        if not args.no_sanitizers:
            ok &= run_sanitizers(args, harness, toolchain, workdir)
    say(f"{PREFIX} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def build_only(workdir: Path) -> int:
    import harness_build

    toolchain = harness_build.find_toolchain()
    if toolchain is None:
        say(f"{PREFIX} FAIL: no nvcc found (set TFAMP_NVCC or CUDA_HOME, or put nvcc on PATH)")
        return 1
    archs = harness_build.target_archs(toolchain)
    start = time.perf_counter()
    library, resources = harness_build.build_gpu(workdir, archs, toolchain)
    say(f"{PREFIX} built {library.name} with nvcc {toolchain.version} for "
        f"{', '.join(f'sm_{a}' for a in archs)} ({time.perf_counter() - start:.1f} s)")
    say_resources(resources, harness_build.conversion_instructions(archs, toolchain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
