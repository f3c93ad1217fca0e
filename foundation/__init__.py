"""The foundation every dp-audit package builds on: nothing here imports ``training``, ``attacks`` or ``audit``.

- :mod:`foundation.errors`: the one-line user errors (exit code 2) and their kinds;
- :mod:`foundation.io`: atomic writes, JSON, hashing and fingerprints;
- :mod:`foundation.files`: the names of every file in a run directory (the only place they are spelt);
- :mod:`foundation.lock`: the run directory's lock;
- :mod:`foundation.result_json`: the base of the result files the auditor writes (``attack.json``, ...);
- :mod:`foundation.config_io`: YAML without surprises, ``--set`` overrides, one-line validation messages.

Imports run one way: ``audit → attacks → training → foundation``.
"""
