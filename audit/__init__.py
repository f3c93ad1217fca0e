"""dp-audit: attacks, empirical epsilon, transfer evaluation, reports and gates for DP vision models."""

__version__ = "0.1.0"
