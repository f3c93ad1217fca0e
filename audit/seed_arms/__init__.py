"""The seed papers' arms that the experiment configs cannot express, as library functions over an :class:`ArmScale`.

* ``continual`` (:func:`~audit.seed_arms.bu.continual_arm`): Bu et al. 2024 — σ = 0 clipping-only arm, the plateau
  switch rule, membership inference of continual checkpoints;
* ``trace`` (:func:`~audit.seed_arms.bu.trace_arm`): Bu et al. 2024 — tr(H) in pre-training vs fine-tuning, and
  whether it peaks and falls;
* ``ke`` (:func:`~audit.seed_arms.ke.ke_arm`): Ke et al. 2024 — head init random / zero / LP-aligned at equal
  backbone steps, head learning rate by parameter group, kNN feature quality over time, the LP share of ε chosen
  on held-out data;
* ``ganesh`` (:func:`~audit.seed_arms.ganesh.ganesh_arm`): Ganesh et al. 2023 — public pre-training budget sweep
  and loss barriers between DP runs from one public init vs from random inits;
* ``vit`` (:func:`~audit.seed_arms.vit.vit_arm`): the representation law — a 12-block ViT pre-trained on public
  images, DP fine-tuned at ε ∈ {1, 3, 8, ∞}, untuned vs tuned by a public-data learning-rate search, per-block
  separation fuzziness and prediction residual with their geometric fits.

Each returns a JSON-able dict with ``per_seed`` lists; ``benchmarks/seed_arms.py`` runs them at a named scale and
``results/reference/seed_findings.md`` states what they show.

>>> sorted(ARMS)
['continual', 'ganesh', 'ke', 'trace', 'vit']
"""

from audit.seed_arms.bu import continual_arm, trace_arm
from audit.seed_arms.common import ArmScale
from audit.seed_arms.ganesh import ganesh_arm
from audit.seed_arms.ke import ke_arm
from audit.seed_arms.vit import vit_arm

__all__ = ["ARMS", "ArmScale", "continual_arm", "trace_arm", "ke_arm", "ganesh_arm", "vit_arm"]

ARMS = {"continual": continual_arm, "trace": trace_arm, "ke": ke_arm, "ganesh": ganesh_arm, "vit": vit_arm}
