"""Run the seed papers' extra arms (:mod:`experiments.arms`) at a named scale and keep their results as JSON.

Usage (from the repository root; needs ``../shared/data``)::

    python -m experiments arms run continual trace ke ganesh vit --scale cpu [--workers 2]
    python -m experiments arms run continual trace ke ganesh vit --scale full  # issue 16's scale (a GPU)
    python -m experiments arms run ganesh --scale cpu_hour --seeds 0 1 2 3 4 --parts same_random  # some parts only
    python -m experiments arms run membership --scale cpu_hour_mia --seeds 0 --parts nondp scratch continual
    python -m experiments arms rescore --scale cpu_hour_mia        # its kept signals scored again, no training
    python -m experiments findings --scale cpu                                # results/reference/seed_findings.md
    python -m experiments arms pretrained --scale cpu_vit_long  # the ViT arm's pre-trained model, whole test split
    python -m experiments arms adopt FILE --scale gpu_full_vit_long --sha256 HEX  # a lease's pre-training, here

Each arm writes ``results/seed_arms/<scale>/<arm>.json`` (its per-seed numbers, the scale, wall time, machine);
:mod:`experiments.findings` turns them and the experiment tables into one claim-by-claim table. ``--workers`` runs arms
in parallel processes of one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from experiments.arms import ARMS, SPLITS
from experiments.arms.scales import SCALES
from experiments.paths import ROOT

OUT = ROOT / "results/seed_arms"


def part_path(scale_name: str, name: str, seed: int, part=None) -> Path:
    """Where one seed of an arm is kept when seeds run as separate jobs (``run --seeds``); an arm of
    :data:`SPLITS` can split further, one part per (seed, ε) or (seed, training)."""
    tag = "" if part is None else "." + SPLITS[name].tag(part)
    return OUT / scale_name / "parts" / f"{name}.s{seed}{tag}.json"


def _join_seed(parts: list[dict]) -> dict:
    """The (seed, part) parts of one seed as one part: ``per_seed`` keys united, ``epsilons``/``sigmas`` united."""
    out = {**parts[0], "per_seed": {}, "epsilons": [], "sigmas": {},
           "wall_seconds": sum(p["wall_seconds"] for p in parts)}
    for p in parts:
        for k, v in p["per_seed"].items():
            out["per_seed"].setdefault(k, v)
        if "summary" in p:  # per-part results that are not per seed (the membership arm's pooled attacks)
            out["summary"] = {**out.get("summary", {}), **p["summary"]}
        out["epsilons"] += [e for e in p.get("epsilons", []) if e not in out["epsilons"]]
        out["sigmas"].update(p.get("sigmas", {}))
    if not out["epsilons"]:
        del out["epsilons"], out["sigmas"]
    return out


def part_label(part: dict, split_field: str) -> str:
    """``s<seed>[.<part>]``: which part of a merged run ``part`` was."""
    values = part["scale_settings"].get(split_field)
    return f"s{part['seeds'][0]}" + (f".{'+'.join(str(v) for v in values)}" if values and len(values) == 1 else "")


def part_machine(part: dict) -> str:
    """Where a part ran (its device and machine) and, when its pre-trained model came from another machine
    (``experiments arms adopt``), where that was trained."""
    where = f"{part.get('device', '?')} ({part.get('machine', '?')})"
    moved = [f"{o['device']}, torch {o['torch']}" for o in (part.get("pretrained_on") or {}).values()
             if o and o.get("adopted")]
    return where + (f"; pre-trained model adopted from {', '.join(sorted(set(moved)))}" if moved else "")


def mixed_machines(parts: list[dict], split_field: str) -> dict[str, str]:
    """{part label: :func:`part_machine`} when the parts of one run did not all run alike; else empty."""
    where = {part_label(p, split_field): part_machine(p) for p in parts}
    return where if len(set(where.values())) > 1 else {}


def mixed_settings(parts: list[dict], split_field: str) -> dict[str, dict[str, Any]]:
    """The scale settings that differ between the parts of one run (other than the seeds and the split field
    itself), each as {part label ``s<seed>[.<part>]``: value}; empty when the parts agree. A part written before
    a field existed ran with that field's default, and is read so."""
    import dataclasses

    from experiments.arms.common import ArmScale

    defaults = {f.name: json.loads(json.dumps(f.default, default=str)) for f in dataclasses.fields(ArmScale)
                if f.default is not dataclasses.MISSING}

    def value(p: dict, k: str) -> Any:
        return p["scale_settings"].get(k, defaults.get(k))

    keys = {k for p in parts for k in p["scale_settings"]} - {"seeds", split_field}
    out = {}
    for k in sorted(keys):
        if len({json.dumps(value(p, k), sort_keys=True, default=str) for p in parts}) > 1:
            out[k] = {part_label(p, split_field): value(p, k) for p in parts}
    return out


def merge(name: str, scale_name: str) -> dict | None:
    """One arm's per-seed parts as the arm's JSON (seeds in order, ``per_seed`` lists joined, wall time summed);
    (seed, ε) parts of a seed are joined first, and only what every seed has is kept. None when no part exists."""
    from foundation.io import write_json

    by_seed: dict[int, list[dict]] = {}
    for p in sorted((OUT / scale_name / "parts").glob(f"{name}.s*.json")):
        part = json.loads(p.read_text())
        by_seed.setdefault(part["seeds"][0], []).append(part)
    if not by_seed:
        return None
    parts = [_join_seed(by_seed[s]) for s in sorted(by_seed)]
    if name == "ke":  # the validation-selected split needs every split of a seed: chosen once they are joined
        from experiments.arms.ke import select_split

        for p in parts:
            flat = {k: v[0] for k, v in p["per_seed"].items()}
            sel = select_split(flat, p["scale_settings"]["lp_fractions"])
            p["per_seed"].update({k: [v] for k, v in sel.items()})
    keys = [k for k in parts[0]["per_seed"] if all(k in p["per_seed"] for p in parts)]
    out = {**parts[0], "seeds": [s for p in parts for s in p["seeds"]],
           "wall_seconds": sum(p["wall_seconds"] for p in parts),
           "per_seed": {k: [v for p in parts for v in p["per_seed"][k]] for k in keys}}
    if "epsilons" in out:  # the ε every seed has
        out["epsilons"] = [e for e in out["epsilons"] if f"{e}_tuned_acc" in out["per_seed"]]
        out["sigmas"] = {e: out["sigmas"][e] for e in out["epsilons"]}
    out["scale_settings"] = {**parts[0]["scale_settings"], "seeds": out["seeds"]}
    split = SPLITS[name]  # each part ran at its one value: the merged run's settings name the values it kept
    mixed = mixed_settings([p for s in sorted(by_seed) for p in by_seed[s]], split.field)
    if mixed:  # e.g. a scale's grad_sample_mode changed between parts: say which part ran how
        out["mixed_settings"] = mixed
    machines = mixed_machines([p for s in sorted(by_seed) for p in by_seed[s]], split.field)
    if machines:  # e.g. a lease ran some parts and this CPU the rest: the merged device/machine are not all's
        out["mixed_machines"] = machines
        out["device"] = out["machine"] = "mixed: see mixed_machines"
    origins = {k: {"device": o["device"], "torch": o["torch"]} for ps in by_seed.values() for p in ps
               for k, o in (p.get("pretrained_on") or {}).items() if o}
    if origins:  # where each pre-trained model was trained, adopted or not
        out["pretrained_on"] = origins
    values = [split.load(v) for ps in by_seed.values() for p in ps for v in p["scale_settings"].get(split.field) or []]
    if values:  # (whole-seed parts of an unsplit run leave a None field as it was)
        kept = {v for v in values if split.marker(v) in out["per_seed"]}
        order = split.parts(SCALES[scale_name]) if scale_name in SCALES else []
        out["scale_settings"][split.field] = sorted(kept, key=lambda v: (order.index(v) if v in order
                                                                         else len(order), str(v)))
    write_json(OUT / scale_name / f"{name}.json", out)
    return out


def pretrained_accuracy(scale_name: str, *, test_images: int = 10**9) -> tuple[float, int]:
    """(accuracy, images) of the ViT arm's seed-0 pre-trained model at ``scale_name`` on up to ``test_images`` of
    the test split (all of it by default, where the arm scores only ``scale.test``): the model the part jobs
    cached in ``results/seed_arms/<scale>/pretrained`` (the same key), trained there if it is absent."""
    from experiments.arms.common import test_acc
    from experiments.arms.vit import pretrained_vit, vit_data

    os.chdir(ROOT)
    scale = SCALES[scale_name]
    # the test split's size changes neither the other images drawn nor the cache key (made of ``scale``)
    data = vit_data(scale.with_(test=test_images))
    model = pretrained_vit(scale, data, seed=0, cache=OUT / scale_name / "pretrained")
    return test_acc(model, data.test), len(data.test)


def adopt_pretrained(src: Path, scale_name: str, *, seed: int = 0, sha256: str | None = None) -> Path:
    """File ``src``, the ViT arm's pre-trained model from a GPU lease (``results/seed_arms/<scale>/pretrained/
    vit-pretrained-*.safetensors`` there), as this machine's cached pre-training of ``seed`` at ``scale_name``, so
    the arm's part jobs that the lease left undone fine-tune the lease's weights here (each part then records
    where its pre-training ran, ``pretrained_on``). ``sha256``: the lease's checksum of the file.

    Raises:
        ValueError: a checksum that differs, or a file trained with other settings (see
            :func:`experiments.arms.model_cache.adopt_cached`).
    """
    import hashlib

    from experiments.arms.model_cache import adopt_cached
    from experiments.arms.vit import PRETRAIN_PREFIX, pretrain_key, vit_data
    from training.device import resolve_device

    src = Path(src).resolve()
    os.chdir(ROOT)
    if not src.is_file():
        raise ValueError(f"{src} does not exist: give the pre-trained model's .safetensors file")
    if sha256 is not None:
        got = hashlib.sha256(src.read_bytes()).hexdigest()
        if got != sha256.lower():
            raise ValueError(f"{src} has sha256 {got}, not the lease's {sha256}: re-assemble the file from its parts")
    scale = SCALES[scale_name]
    key = pretrain_key(scale, vit_data(scale), seed=seed, device=resolve_device("auto"))
    return adopt_cached(src, OUT / scale_name / "pretrained", key, prefix=PRETRAIN_PREFIX)


def run_arm(name: str, scale_name: str, seed: int | None = None, part=None) -> tuple[str, float]:
    """Run one arm at a named scale (all seeds, or one ``seed``, or one ``part`` of a seed: see :data:`SPLITS`) and
    write its JSON; returns (arm, seconds)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from training.device import resolve_device
    from foundation.io import write_json

    torch.set_num_threads(1)
    os.chdir(ROOT)
    scale = SCALES[scale_name] if seed is None else SCALES[scale_name].with_(seeds=(seed,))
    if part is not None:  # one part of a seed (experiments.arms.SPLITS)
        if seed is None:
            raise ValueError("a part is one seed's: give the seed")
        scale = scale.with_(**{SPLITS[name].field: (part,)})
    device = resolve_device("auto")
    t0 = time.perf_counter()
    # runs and part jobs share what they would each pre-train alike (a seed's ViT, the Ke source) through a cache
    extra = {"pretrained_cache": OUT / scale_name / "pretrained"} if name in ("vit", "ke") else {}
    if name == "membership":  # the attacks' signals, to re-score without training
        extra = {"signals_dir": OUT / scale_name / "membership_signals"}
    res = ARMS[name](scale, device=device, log=lambda m: print(f"[{name}] {m}", flush=True), **extra)
    secs = time.perf_counter() - t0
    res.update({"wall_seconds": secs, "device": str(device), "machine": f"{platform.machine()}, {os.cpu_count()} "
                f"CPU cores, torch {torch.__version__}", "scale_settings": {k: v for k, v in vars(scale).items()}})
    write_json(OUT / scale_name / f"{name}.json" if seed is None else part_path(scale_name, name, seed, part),
               res)
    return name, secs


def main(argv: list[str] | None = None, prog: str = "python -m experiments arms") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run arms at a scale, write results/seed_arms/<scale>/<arm>.json")
    p.add_argument("arms", nargs="+", choices=sorted(ARMS))
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="run these seeds one at a time, each kept as a part (join them with `merge`)")
    p.add_argument("--parts", nargs="+", default=None,
                   help="with --seeds: only these parts of each seed (experiments.arms.SPLITS), each kept as its own "
                        "part file and not merged (the arm's JSON is left as it is)")
    r = sub.add_parser("rescore", help="the membership arm's parts scored again from their kept signals (every "
                       "attack of the suite; no training), then merged")
    r.add_argument("--scale", choices=sorted(SCALES), default="cpu_hour_mia")
    m = sub.add_parser("merge", help="join the per-seed parts of arms (written by experiments/gpu/) into <arm>.json")
    m.add_argument("arms", nargs="+", choices=sorted(ARMS))
    m.add_argument("--scale", choices=sorted(SCALES), default="gpu")
    v = sub.add_parser("pretrained", help="the ViT arm's pre-trained model (seed 0; the one every seed shares with "
                       "vit_shared_pretrain) on the whole test split: loaded from the run's cache, trained if absent")
    v.add_argument("--scale", choices=sorted(SCALES), default="cpu_vit_long")
    d = sub.add_parser("adopt", help="file the ViT arm's pre-trained model from a GPU lease as this machine's "
                       "cached one, so the arm's remaining parts fine-tune it here")
    d.add_argument("file", type=Path)
    d.add_argument("--scale", choices=sorted(SCALES), default="gpu_full_vit_long")
    d.add_argument("--seed", type=int, default=0, help="the pre-training's seed (0 where every seed shares one)")
    d.add_argument("--sha256", default=None, help="the lease's checksum of the file (refused when it differs)")
    args = parser.parse_args(argv)
    if args.cmd == "adopt":
        try:
            path = adopt_pretrained(args.file, args.scale, seed=args.seed, sha256=args.sha256)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"adopted {args.file} as {path}", flush=True)
        return 0
    if args.cmd == "pretrained":
        acc, n = pretrained_accuracy(args.scale)
        print(f"{args.scale}: the pre-trained ViT (seed 0) {100 * acc:.1f} % on {n} test images", flush=True)
        return 0
    if args.cmd == "rescore":
        from experiments.arms.membership import rescore_parts

        parts = sorted((OUT / args.scale / "parts").glob("membership.s*.json"))
        try:
            done = rescore_parts(parts, OUT / args.scale / "membership_signals")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        got = merge("membership", args.scale)
        print(f"membership: {len(done)} part(s) re-scored" + (f", merged: {sorted(got['summary'])}" if got else ""),
              flush=True)
        return 0
    if args.cmd == "merge":
        for a in args.arms:
            got = merge(a, args.scale)
            print(f"{a}: " + (f"seeds {got['seeds']}" if got else "no parts"), flush=True)
        return 0
    if args.parts is not None:
        if args.seeds is None or len(args.arms) != 1:
            print("error: --parts needs --seeds and one arm: e.g. arms run ganesh --scale cpu_hour --seeds 0 1 "
                  "--parts same_random", file=sys.stderr)
            return 2
        a = args.arms[0]
        every = [str(v) for v in SPLITS[a].parts(SCALES[args.scale])]
        bad = [v for v in args.parts if v not in every]
        if bad:
            print(f"error: --parts {' '.join(bad)}: not a part of {a} at {args.scale}; its parts are "
                  f"{', '.join(every)}", file=sys.stderr)
            return 2
        for seed in args.seeds:
            for part in args.parts:
                secs = run_arm(a, args.scale, seed, SPLITS[a].load(part))[1]
                print(f"{a} seed {seed} part {part}: {secs:.0f} s -> {part_path(args.scale, a, seed, part)}",
                      flush=True)
        return 0
    if args.seeds is not None:
        for a in args.arms:
            for seed in args.seeds:
                print(f"{a} seed {seed}: {run_arm(a, args.scale, seed)[1]:.0f} s", flush=True)
            merge(a, args.scale)
        return 0
    if args.workers <= 1:
        for a in args.arms:
            print(f"{a}: {run_arm(a, args.scale)[1]:.0f} s", flush=True)
        return 0
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(run_arm, a, args.scale) for a in args.arms]):
            name, secs = fut.result()
            print(f"{name}: {secs:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
