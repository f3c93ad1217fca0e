"""``python -m experiments``: the seed-paper reproductions' command line (:mod:`experiments.cli`)."""

from experiments.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
