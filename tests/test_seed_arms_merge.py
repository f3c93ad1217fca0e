"""`experiments arms merge`: the per-seed parts of an arm joined into one run that says how and where each
part ran (parts written by GPU leases and by this CPU, before and after a setting changed)."""

from __future__ import annotations

import json

from experiments.arms import ArmScale

TINY = ArmScale(name="tiny", dataset="digits", root=None, private=120, public=60, val=40, test=60, batch_size=20,
                steps=6, seeds=(0,), accountant="rdp")


def test_merge_names_the_parts_that_ran_with_other_settings(tmp_path, monkeypatch):
    """Parts of one run that differ in a setting (gpu_full's DP steps moved from hooks to bk part-way through its
    tr(H) arm) merge with a ``mixed_settings`` record of who ran how; agreeing parts leave none."""
    from experiments.arms import runner

    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_mix", TINY.with_(name="tiny_mix"))
    folder = tmp_path / "tiny_mix" / "parts"
    folder.mkdir(parents=True)

    def part(seed, run, mode):
        settings = {**json.loads(json.dumps(vars(TINY), default=str)), "seeds": [seed], "trace_runs": [run],
                    "grad_sample_mode": mode}
        body = {"arm": "trace", "seeds": [seed], "wall_seconds": 1.0, "scale_settings": settings,
                "per_seed": {f"{run}_acc": [0.5 + seed / 10]}}
        (folder / f"trace.s{seed}.{run}.json").write_text(json.dumps(body))

    for seed in (0, 1):
        part(seed, "pretrain_nondp", "hooks")
        part(seed, "pretrain_dp", "hooks")
    merged = runner.merge("trace", "tiny_mix")
    assert "mixed_settings" not in merged and merged["per_seed"]["pretrain_dp_acc"] == [0.5, 0.6]
    part(1, "pretrain_dp", "bk")
    merged = runner.merge("trace", "tiny_mix")
    assert merged["mixed_settings"] == {"grad_sample_mode": {"s0.pretrain_dp": "hooks", "s0.pretrain_nondp": "hooks",
                                                             "s1.pretrain_dp": "bk", "s1.pretrain_nondp": "hooks"}}
    # a part written before a field existed ran with the field's default: no difference to report
    old = json.loads((folder / "trace.s0.pretrain_nondp.json").read_text())
    del old["scale_settings"]["ke_source"]
    (folder / "trace.s0.pretrain_nondp.json").write_text(json.dumps(old))
    assert set(runner.merge("trace", "tiny_mix")["mixed_settings"]) == {"grad_sample_mode"}
    old["scale_settings"]["ke_source"] = "vit"
    (folder / "trace.s0.pretrain_nondp.json").write_text(json.dumps(old))
    assert set(runner.merge("trace", "tiny_mix")["mixed_settings"]) == {"grad_sample_mode", "ke_source"}


def test_merge_names_where_each_part_ran_when_the_parts_ran_on_different_machines(tmp_path, monkeypatch):
    """A run whose parts ran partly on a GPU lease and partly on this CPU (with the lease's pre-trained model
    adopted) merges with ``mixed_machines`` (who ran where, and the adopted model's origin) instead of claiming
    the first part's device for all; parts that ran alike leave none."""
    from experiments.arms import runner

    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_where", TINY.with_(name="tiny_where"))
    folder = tmp_path / "tiny_where" / "parts"
    folder.mkdir(parents=True)
    gpu = {"device": "cuda", "machine": "x86_64, 16 CPU cores, torch 2.11.0+cu130"}

    def part(seed, eps, where, origin=None):
        settings = {**json.loads(json.dumps(vars(TINY), default=str)), "seeds": [seed], "vit_epsilons": [eps]}
        body = {"arm": "vit", "seeds": [seed], "wall_seconds": 1.0, "scale_settings": settings, **where,
                "epsilons": [f"eps{eps:g}"], "sigmas": {f"eps{eps:g}": 1.0},
                "per_seed": {f"eps{eps:g}_tuned_acc": [0.5], f"eps{eps:g}_untuned_acc": [0.5]}}
        if origin is not None:
            body["pretrained_on"] = {"0": origin}
        (folder / f"vit.s{seed}.eps{eps:g}.json").write_text(json.dumps(body))

    for seed in (0, 1):
        part(seed, 8, gpu)
    merged = runner.merge("vit", "tiny_where")
    assert "mixed_machines" not in merged and merged["device"] == "cuda"
    part(1, 8, {"device": "cpu", "machine": "x86_64, 2 CPU cores, torch 2.14.1"},
         {"device": "cuda", "torch": "2.11.0+cu130", "adopted": True})
    merged = runner.merge("vit", "tiny_where")
    assert merged["mixed_machines"] == {
        "s0.8": "cuda (x86_64, 16 CPU cores, torch 2.11.0+cu130)",
        "s1.8": "cpu (x86_64, 2 CPU cores, torch 2.14.1); pre-trained model adopted from cuda, torch 2.11.0+cu130"}
    assert merged["device"].startswith("mixed") and merged["pretrained_on"] == {
        "0": {"device": "cuda", "torch": "2.11.0+cu130"}}
