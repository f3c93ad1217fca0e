"""The seed papers' arms that the experiment configs cannot express, as library functions over an :class:`ArmScale`.

* ``continual`` (:func:`~experiments.arms.bu.continual_arm`): Bu et al. 2024 — σ = 0 clipping-only arm, the plateau
  switch rule, membership inference of continual checkpoints;
* ``trace`` (:func:`~experiments.arms.bu.trace_arm`): Bu et al. 2024 — tr(H) in pre-training vs fine-tuning, and
  whether it peaks and falls;
* ``ke`` (:func:`~experiments.arms.ke.ke_arm`): Ke et al. 2024 — head init random / zero / LP-aligned at equal
  backbone steps, head learning rate by parameter group, kNN feature quality over time, the LP share of ε chosen
  on held-out data;
* ``ganesh`` (:func:`~experiments.arms.ganesh.ganesh_arm`): Ganesh et al. 2023 — public pre-training budget sweep
  and loss barriers between DP runs from one public init vs from random inits;
* ``membership`` (:func:`~experiments.arms.membership.membership_arm`): Bu et al. 2024 — the continual arm's
  trainings attacked with the suite's strongest attacks (LiRA, RMIA; each of many models the target in turn, the
  others its references), TPR at 1 % and 0.1 % FPR;
* ``vit`` (:func:`~experiments.arms.vit.vit_arm`): the representation law — a 12-block ViT pre-trained on public
  images, DP fine-tuned at ε ∈ {1, 3, 8, ∞}, untuned vs tuned by a public-data learning-rate search, per-block
  separation fuzziness and prediction residual with their geometric fits.

Each returns a JSON-able dict with ``per_seed`` lists; :mod:`experiments.arms.runner` runs them at a named scale and
``results/reference/seed_findings.md`` states what they show. :data:`SPLITS` says how one seed of each arm splits
into independent parts (a GPU queue runs one job each; joined, they are the arm run whole).

>>> sorted(ARMS)
['continual', 'ganesh', 'ke', 'membership', 'trace', 'vit']
>>> SPLITS["continual"].parts(ArmScale(name="x"))
['nondp', 'clip_only', 'scratch', 'continual', 'plateau']
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiments.arms.bu import continual_arm, trace_arm
from experiments.arms.common import CONTINUAL_ARMS, TRACE_RUNS, ArmScale, chosen_parts
from experiments.arms.ganesh import ganesh_arm, ganesh_parts
from experiments.arms.ke import ke_arm, ke_parts
from experiments.arms.membership import MEMBERSHIP_FAMILIES, membership_arm
from experiments.arms.vit import eps_tag, vit_arm

__all__ = ["ARMS", "SPLITS", "Split", "ArmScale", "continual_arm", "trace_arm", "ke_arm", "ganesh_arm", "vit_arm",
           "membership_arm"]

ARMS = {"continual": continual_arm, "trace": trace_arm, "ke": ke_arm, "ganesh": ganesh_arm, "vit": vit_arm,
        "membership": membership_arm}


@dataclass(frozen=True)
class Split:
    """How one seed of an arm splits into parts.

    Attributes:
        field: the :class:`ArmScale` field a part narrows to its one value.
        parts: the parts of one seed at a scale.
        tag: a part's name in file names.
        marker: a per-seed key that only that part writes (so a joined result shows which parts it holds).
        load: a part's value as read back from JSON (ε: ``"inf"`` → ``inf``).
    """

    field: str
    parts: Callable[[ArmScale], list]
    tag: Callable[[Any], str] = str
    marker: Callable[[Any], str] = "{}_acc".format
    load: Callable[[Any], Any] = lambda v: v


SPLITS = {
    "vit": Split("vit_epsilons", lambda s: [float(e) for e in s.vit_epsilons], tag=lambda e: eps_tag(float(e)),
                 marker=lambda e: f"{eps_tag(float(e))}_tuned_acc", load=float),
    "continual": Split("continual_arms", lambda s: chosen_parts(s, "continual_arms", CONTINUAL_ARMS)),
    "trace": Split("trace_runs", lambda s: chosen_parts(s, "trace_runs", TRACE_RUNS)),
    "ganesh": Split("ganesh_parts", lambda s: chosen_parts(s, "ganesh_parts", ganesh_parts(s)),
                    marker=lambda p: {"same": "barrier_same_public", "random": "barrier_random",
                                     "same_random": "barrier_same_random",
                                     "nondp": "nondp_public0_acc"}.get(p, f"{p}_acc")),
    "ke": Split("ke_parts", lambda s: chosen_parts(s, "ke_parts", ke_parts(s))),
    # one part per training (family) of the membership arm: its models are all of the part's (not one per seed)
    "membership": Split("continual_arms", lambda s: chosen_parts(s, "continual_arms", MEMBERSHIP_FAMILIES)),
}
