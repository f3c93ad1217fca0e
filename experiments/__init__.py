"""The seed papers' reproductions, apart from the dp-audit product: what they ran, how, and what they found.

* :mod:`experiments.papers`: the experiment configs (``eval_configs/experiments``) at named scales, trained through
  the product's pipeline, and their tables (``continual_pretrain``, ``decelerator``, ``finetune_strategies``);
* :mod:`experiments.arms`: the arms those configs cannot express (σ = 0, head inits, the Ganesh et al. sweep and
  barriers, tr(H) curves, the ViT representation law), their scales and the merge of their per-seed parts;
* :mod:`experiments.gpu`: the data slice, deadline-bound job queue and result packs of a lent GPU machine;
* :mod:`experiments.findings`: ``results/reference/seed_findings.md``, every claim with its test and verdict, its
  prose generated from the result files;
* :mod:`experiments.stats`: the statistics every seed table uses (Welch, Holm, pooled SD, verdicts).

Imports run one way: this package uses ``audit``, ``attacks``, ``training`` and ``foundation``; none of them
imports it. Command line: ``python -m experiments`` (:mod:`experiments.cli`), installed as ``dp-audit-experiments``.
"""
