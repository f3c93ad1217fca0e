"""The seed-paper runs on a lent GPU machine: the data that fits its upload (:mod:`~experiments.gpu.data`), the
deadline-bound job queue (:mod:`~experiments.gpu.queue`), the result packs (:mod:`~experiments.gpu.pack`) and a
one-process profile (:mod:`~experiments.gpu.profile`); ``python -m experiments gpu`` (:mod:`~experiments.gpu.cli`)."""
