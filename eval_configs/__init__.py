"""The configs shipped with dp-audit (data only: every ``*.yaml`` below this folder ships in the wheel).

Commands that fall back on a shipped config find it through :mod:`importlib.resources`
(:func:`foundation.config_io.shipped_config`), so an installed wheel works from any directory.
"""
