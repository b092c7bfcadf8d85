"""The figure users compare runs with: training loss fp32 vs AMP, and the loss scale.

Two panels: the training loss of both runs per step (each raw, faint, and as a moving
average) and the dynamic loss scale of the AMP run (log2 axis), with the number of
steps it skipped because the gradients overflowed.  Drawn with
matplotlib's Agg backend, so no display is needed.
"""
from __future__ import annotations

from typing import List


def moving_average(values: List[float], window: int) -> List[float]:
    """The mean of the last ``window`` values at each position (fewer at the start)."""
    result, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        result.append(total / min(index + 1, window))
    return result


def plot_loss_curves(path: str, fp32_history: List[dict], amp_history: List[dict], title: str) -> str:
    """Writes the PNG to ``path``; the histories are ``[{"step", "loss", "loss_scale"}, ...]``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (loss_axes, scale_axes) = pyplot.subplots(1, 2, figsize=(11, 4))
    window = max(1, len(fp32_history) // 30)
    for history, label, colour in ((fp32_history, "float32", "tab:blue"), (amp_history, "AMP", "tab:orange")):
        steps = [h["step"] for h in history]
        losses = [h["loss"] for h in history]
        loss_axes.plot(steps, losses, color=colour, alpha=0.25, linewidth=0.8)
        loss_axes.plot(steps, moving_average(losses, window), color=colour, label=label)
    loss_axes.set_yscale("log")
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("training loss")
    loss_axes.set_title("training loss (moving average over %d steps)" % window)
    loss_axes.legend()
    scales = [(h["step"], h["loss_scale"]) for h in amp_history if h["loss_scale"] is not None]
    if scales:
        scale_axes.step([s for s, _ in scales], [v for _, v in scales], where="post", color="tab:orange")
        scale_axes.set_yscale("log", base=2)
        overflows = sum(1 for (_, before), (_, after) in zip(scales, scales[1:]) if after < before)
        scale_axes.text(0.02, 0.04, "%d step(s) skipped on inf/nan gradients (scale halved)" % overflows,
                        transform=scale_axes.transAxes)
    scale_axes.set_xlabel("step")
    scale_axes.set_ylabel("loss scale")
    scale_axes.set_title("AMP dynamic loss scale")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
