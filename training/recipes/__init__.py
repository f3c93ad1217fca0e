"""Training recipes: ``standard``, ``continual_pretrain`` (Bu et al. 2024), ``finetune`` (Ke et al. 2024).

``RECIPES[name](setup, ctx)`` builds the recipe object the trainer drives (see :mod:`training.recipes.common`);
the phases it yields run through :func:`training.loop.run_phases`.

>>> sorted(RECIPES)
['continual_pretrain', 'finetune', 'standard']
"""

from training.recipes.common import Recipe, RunSetup
from training.recipes.continual import ContinualRecipe
from training.recipes.finetune import FinetuneRecipe
from training.recipes.standard import StandardRecipe

__all__ = ["RECIPES", "Recipe", "RunSetup", "StandardRecipe", "ContinualRecipe", "FinetuneRecipe"]

RECIPES = {"standard": StandardRecipe, "continual_pretrain": ContinualRecipe, "finetune": FinetuneRecipe}
