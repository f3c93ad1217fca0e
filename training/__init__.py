"""dp-audit training: datasets, models, the DP engine, accountants, training loops and checkpoints.

This package never imports :mod:`attacks` or :mod:`audit` (imports flow ``audit -> attacks -> training``).
"""

__version__ = "0.1.0"
