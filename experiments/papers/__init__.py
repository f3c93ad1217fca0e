"""The seed-paper experiment configs at named scales (:mod:`~experiments.papers.runs`), their continual
pre-training tables (:mod:`~experiments.papers.continual`) and fine-tuning table
(:mod:`~experiments.papers.finetune`); ``python -m experiments papers`` (:mod:`~experiments.papers.cli`)."""
