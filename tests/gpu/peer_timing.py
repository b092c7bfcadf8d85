"""The peers the kernel is measured against, on the same gradient lists, timed the same way.

* PyTorch's fused step: ``torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf,
  inv_scale)``, what ``torch.cuda.amp.GradScaler`` runs. It works in place only, so the
  out-of-place rows compare with it too (it moves the same bytes).
* A composite stand-in for TensorFlow's per-tensor ops, as its LossScaleOptimizer builds them:
  per gradient ``g * inv_scale`` (in place: ``mul_``), ``isfinite``, reduce to one flag;
  then the ``all`` of the flags.

Both run with PyTorch on the GPU (the machines we use have it; TensorFlow is not there).
Times are device times from CUDA events around back-to-back calls after 3 warm-up calls, as
the kernel's; the composite's include the gaps where the GPU waits for Python to launch its
3 kernels per tensor, as a framework's per-op launches do.
"""
from __future__ import annotations

import collections
from typing import Optional, Sequence, Tuple

# Each: ms per call, or a string saying why the peer could not run.
PeerTimes = collections.namedtuple("PeerTimes", "pytorch_ms composite_ms")
TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def load_torch() -> Tuple[Optional[object], Optional[str]]:
    """(torch, None) when PyTorch can run on this GPU, else (None, why not) in one line."""
    try:
        import torch
    except Exception as error:  # ImportError, or a broken install's own error
        return None, f"PyTorch is not importable ({type(error).__name__}: {error})"
    if not torch.cuda.is_available():
        return None, f"PyTorch {torch.__version__} sees no CUDA device"
    if not hasattr(torch, "_amp_foreach_non_finite_check_and_unscale_"):
        return None, (f"PyTorch {torch.__version__} has no "
                      "_amp_foreach_non_finite_check_and_unscale_")
    return torch, None


def _elapsed_ms(torch, call, iterations: int) -> float:
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        call()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iterations


def time_peers(torch, sizes: Sequence[int], kind: str, iterations: int,
               in_place: bool) -> PeerTimes:
    """Per-call device ms of PyTorch's op and of the composite on gradients of ``sizes``."""
    dtype = getattr(torch, TORCH_DTYPES[kind])
    generator = torch.Generator(device="cuda").manual_seed(0)
    grads = [torch.randn(int(n), device="cuda", dtype=torch.float32,
                         generator=generator).to(dtype) for n in sizes]
    found_inf = torch.zeros(1, device="cuda", dtype=torch.float32)
    # In place, a scale of 1 keeps the values what they are however often the step runs.
    inv_scale = torch.full((1,), 1.0 if in_place else 2.0**-7, device="cuda",
                           dtype=torch.float32)

    def pytorch_step():
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)

    scalar = inv_scale.reshape(())  # a 0-d scale keeps each product in its gradient's dtype

    def composite_step():
        flags = []
        for g in grads:
            out = g.mul_(scalar) if in_place else g * scalar
            flags.append(torch.isfinite(out).all())
        return torch.stack(flags).all()

    try:
        return PeerTimes(_timed_or_why(torch, pytorch_step, iterations),
                         _timed_or_why(torch, composite_step, iterations))
    finally:
        grads.clear()  # the closures hold the list: empty it to free the memory now
        torch.cuda.empty_cache()


def _timed_or_why(torch, call, iterations: int):
    """ms per call, or the one-line reason PyTorch refused (e.g. a dtype it lacks)."""
    try:
        return _elapsed_ms(torch, call, iterations)
    except RuntimeError as error:
        return str(error).splitlines()[0][:120]
