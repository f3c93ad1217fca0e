"""dp-audit attacks: membership signals, membership-inference attacks and their metrics.

Every attack score is "higher = member". Importing this package registers the built-in attacks:
``loss``, ``attack_p``, ``calibrated_loss``, ``lira_online``, ``lira_offline``, ``rmia_online``,
``rmia_offline`` (see :mod:`attacks.registry`).
"""

# The package re-exports each module's public API (its ``__all__``), so every list lives in one place; importing
# baselines, lira and rmia registers their attacks.
from attacks import baselines, lira, metrics, registry, resolution, rmia, signals, slices
from attacks.baselines import *  # noqa: F403
from attacks.lira import *  # noqa: F403
from attacks.metrics import *  # noqa: F403
from attacks.registry import *  # noqa: F403
from attacks.resolution import *  # noqa: F403
from attacks.rmia import *  # noqa: F403
from attacks.signals import *  # noqa: F403
from attacks.slices import *  # noqa: F403

__all__ = [*registry.__all__, *baselines.__all__, *lira.__all__, *rmia.__all__, *signals.__all__, *metrics.__all__,
           *resolution.__all__, *slices.__all__]
