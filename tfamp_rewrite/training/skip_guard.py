"""When a run of skipped steps is worth a diagnosis: ``SkipGuard``, per loss-scaled train op.

A skipped step is a loss-scaled step whose gradients were not all finite.  An *episode* is a
stretch of skipped steps that ends once ``RECOVERED_AFTER`` steps in a row have applied.
Dynamic loss scaling halves the scale at each skip, so a scale that starts too high falls a
few steps and recovers; a tensor that is inf or beyond the half range whatever the scale
makes every step skip until the scale sits at its floor, and training freezes -- or, where
only some batches overflow (outliers every other batch), every such batch is skipped for
good while the others apply, and the scale sinks to its floor all the same.  The guard::

    observe(scale, applied):
        applied:  counted; the RECOVERED_AFTER-th in a row (or twice the longest run of
                  applied steps between its skips, if more) ends the episode (if any) --
                  until the scale grows, a later skip resumes it: batches that overflow
                  one in 25 walk the scale down to its floor one halving at a time, in
                  what is one fall
        skipped:  record scale in the episode's trajectory
                  due = scale fell by 2**fall_log2 since the episode began, or the
                        scale sits at min_loss_scale
    a due episode is diagnosed on the next skipped step (``diagnosis_due``: the probes ride
    each step until one skips, as only a skipped one shows the culprit -- the first
    PROBED_APPLIED_MOST applied steps in a row, then one in PROBED_THEN_EVERY); a diagnosis that names
    no culprit above the floor waits for the floor (gradients may overflow only because the
    scale is still too high), and one at the floor that names none says so, once.
    ``observe`` hands back the episode an applied step ends: the session says once when a
    long one (a fall of 2**fall_log2 or more) ended with no culprit -- the scale started too high.

After a heal (``restart(after_heal=True)``) the first skipped step is diagnosed at once: a
forward tensor the heal made float32 often hands a large value on to the next half node,
and that needs no fall of the scale to be named.  So is, once per episode, a skipped step
whose loss was itself inf/nan (``observe(..., loss_finite=False)``): a forward value made it,
which no loss scale makes or mends (a -1e9 padding bias, a raw feature past 65504).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

DEFAULT_FALL_LOG2 = 8
# Applied steps in a row that end an episode: a scale that started too high recovers for
# good, where batches that overflow now and then keep the episode (and its fall) going.
RECOVERED_AFTER = 8
# Applied steps in a row that carry a due diagnosis's probes (each such run about twice as
# slow), then one in PROBED_THEN_EVERY does, until a step skips: skips a thousand steps
# apart carried them on every step between.
PROBED_APPLIED_MOST = 64
PROBED_THEN_EVERY = 8


@dataclass
class Episode:
    """A stretch of skipped steps: the scale of the first (the last applied step's) and of
    each, and how many steps applied among them."""

    start_scale: float
    scales: List[float] = field(default_factory=list)
    applied: int = 0                    # steps applied since the first skip
    applied_in_a_row: int = 0           # ... since the last skip
    longest_gap: int = 0                # the most steps applied in a row between two skips
    diagnosed_after_fall: bool = False  # a diagnosis ran once the scale had fallen far enough
    diagnosed_at_floor: bool = False    # a diagnosis ran with the scale at its floor
    diagnosed_for_loss: bool = False    # one was asked for as a step's loss was inf/nan
    named: bool = False                 # a culprit was named (the warning is given once)
    float32s_own: bool = False          # its inf/nan traced to float32 itself: no heal mends it

    @property
    def skipped(self) -> int:
        return len(self.scales)

    def trajectory(self) -> str:
        """``"32768 -> 16384 -> ... -> 1 (12 skipped steps)"``: the scales the skipped steps used."""
        values = self.scales
        shown = values if len(values) <= 8 else values[:4] + [None] + values[-3:]
        text = " -> ".join("..." if v is None else "%g" % v for v in shown)
        between = self.applied - self.applied_in_a_row
        return "%s (%d skipped step%s%s)" % (text, self.skipped, "" if self.skipped == 1 else "s",
                                             ", %d applied between them" % between if between else "")


class SkipGuard:
    """Tracks one train op's steps (see module docstring)."""

    def __init__(self, min_loss_scale: float = 1.0, fall_log2: int = DEFAULT_FALL_LOG2):
        self.min_loss_scale = float(min_loss_scale)
        self.fall_log2 = int(fall_log2)
        self.episode: Optional[Episode] = None
        self._due = False
        self._after_heal = False
        self._resumable: Optional[Episode] = None  # ended by applied steps, the scale not grown
        self._applied_at: Optional[float] = None   # the scale the last applied step used
        self._probed_applied = 0    # applied steps in a row while a diagnosis is due

    def observe(self, scale: float, applied: bool, loss_finite: bool = True) -> Optional[Episode]:
        """Records one step: the scale it used, whether its update was applied, and whether
        the loss its gradients came from was finite.  Returns the episode an applied step
        ended, if any."""
        episode = self.episode
        if applied:
            grew = self._applied_at is not None and scale > self._applied_at
            self._applied_at = scale
            if episode is None:
                resumable = self._resumable
                if resumable is not None and grew:
                    self._resumable = None  # the scale grew: a new fall starts afresh
                elif resumable is not None:
                    resumable.applied += 1
                    resumable.applied_in_a_row += 1
                return None
            episode.applied += 1
            episode.applied_in_a_row += 1
            if self._due:
                self._probed_applied += 1
            if episode.applied_in_a_row < max(RECOVERED_AFTER, 2 * episode.longest_gap):
                return None
            # no probes ride the steps of a scale that recovered; a later skip resumes the
            # episode, and is due again where the fall and the floor say so
            self.episode, self._resumable, self._due = None, episode, False
            return episode
        if episode is None and self._resumable is not None:
            episode = self.episode = self._resumable  # sparse skips: the same fall goes on
        elif episode is None:
            episode = self.episode = Episode(start_scale=float(scale))
        self._resumable = None
        if episode.scales:
            episode.longest_gap = max(episode.longest_gap, episode.applied_in_a_row)
        episode.applied_in_a_row = 0
        episode.scales.append(float(scale))
        self._probed_applied = 0
        if episode.named:
            return None
        if self._after_heal:
            self._after_heal, self._due = False, True
            return None
        if not loss_finite and not episode.diagnosed_for_loss:
            # an inf/nan loss is a forward value's, which no scale makes or mends
            episode.diagnosed_for_loss, self._due = True, True
            return None
        if scale <= self.min_loss_scale:
            self._due = self._due or not episode.diagnosed_at_floor
        elif self.fell_far(episode, scale):
            self._due = self._due or not episode.diagnosed_after_fall
        return None

    def fell_far(self, episode: Episode, scale: float) -> bool:
        """True when ``scale`` is 2**fall_log2 or more below where ``episode`` started."""
        return episode.start_scale / float(scale) >= 2.0 ** self.fall_log2

    @property
    def diagnosis_due(self) -> bool:
        """True when the next step should carry the probes: while a diagnosis is due, each
        of the first PROBED_APPLIED_MOST applied steps in a row, then one in PROBED_THEN_EVERY."""
        return self._due and (self._probed_applied < PROBED_APPLIED_MOST
                              or self._probed_applied % PROBED_THEN_EVERY == 0)

    @property
    def at_floor(self) -> bool:
        """True when the episode's last step used the floor scale."""
        return self.episode is not None and self.episode.scales[-1] <= self.min_loss_scale

    def diagnosed(self, named: bool) -> None:
        """Records a diagnosis of the current episode (it ran on the step after the last)."""
        self._due = False
        if self.episode is not None:
            self.episode.diagnosed_after_fall = True
            self.episode.diagnosed_at_floor = self.episode.diagnosed_at_floor or self.at_floor
            self.episode.named = self.episode.named or named

    def restart(self, after_heal: bool = False) -> None:
        """Forgets the episode (steps applied again, or a heal restarted the scale)."""
        self.episode, self._due, self._resumable = None, False, None
        self._probed_applied = 0
        self._after_heal = after_heal
