"""Tests of `audit report`: sections, numbers equal to the JSON files, self-containment, real rendering."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from audit.cli import main
from audit.reporting import Figures, PoolImages, build_report, load_run, render_html, write_report
from audit.reporting.chromium import find_chromium, headless_args
from fixtures_runs import LEVELS, make_run, pool_arrays, update_json
from foundation.io import read_json
from training.run.freshness import evidence_identity
from training.run.manifest import read_manifest

SECTIONS = ["glance", "claim", "threat", "attacks", "epsilon", "utility", "provenance", "limitations"]
MD_HEADINGS = ["## 1. Verdict at a glance", "## 2. The claim", "## 3. Threat model", "## 4. Attacks",
               "## 5. ε lower bounds", "## 6. Utility and transfer", "## 7. Provenance and reproduction",
               "## 8. Limitations"]


def _p4(x: float) -> str:  # independent of audit.reporting.fmt on purpose
    return f"{x:.4f}"


def _e3(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.3f}"


def _write(run: Path, **kw):
    return write_report(run_dir=run, load_images=False, generated="2025-01-02T03:04:05+00:00", **kw)


def _row(html: str, attr: str, value: str) -> str:
    m = re.search(rf'<tr {attr}="{re.escape(value)}">(.*?)</tr>', html, flags=re.S)
    assert m, f"no row {attr}={value}"
    return m.group(1)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run_a", attacks=("loss", "calibrated_loss", "lira_online", "rmia_offline"))


def test_every_section_present_in_order(run: Path) -> None:
    paths = _write(run)
    html = paths.html.read_text()
    positions = [html.index(f'data-section="{s}"') for s in SECTIONS]
    assert positions == sorted(positions)
    md = paths.markdown.read_text()
    md_pos = [md.index(h) for h in MD_HEADINGS]
    assert md_pos == sorted(md_pos)
    assert "not run" not in html.lower() and "not run" not in md.lower()
    data = read_json(paths.json)
    assert data["format"] == "dp-audit-report/1"
    assert {"glance", "claim", "threat", "attacks", "epsilon", "utility", "provenance", "limitations"} <= set(data)


def test_attack_numbers_equal_attack_json(run: Path) -> None:
    paths = _write(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    attack = read_json(run / "attack.json")
    for name, entry in attack["attacks"].items():
        m = entry["metrics"]
        row = _row(html, "data-attack", name)
        md_row = next(line for line in md.splitlines() if line.startswith(f"| {name} |"))
        expected = [_p4(m["auc"]), f"[{_p4(m['auc_ci'][0])}, {_p4(m['auc_ci'][1])}]", _p4(m["balanced_accuracy"])]
        for lv in LEVELS:   # a TPR below 1/N non-members is written as text, never as a number
            lo, hi = m["tpr_at_fpr_ci"][lv]
            expected += ([_p4(m["tpr_at_fpr"][lv]), f"[{_p4(lo)}, {_p4(hi)}]"]
                         if float(lv) * m["n_nonmembers"] >= 1 else [f"not resolvable with {m['n_nonmembers']} non-members"])
        assert any(float(lv) * m["n_nonmembers"] < 1 for lv in LEVELS)   # the fixture has an unresolvable level
        for text in expected:
            assert text in row, (name, text)
            assert text in md_row, (name, text)
        assert f"{m['n_members']} / {m['n_nonmembers']}" in row
    # report.json carries the unrounded values
    rows = {r["name"]: r for r in read_json(paths.json)["attacks"]["rows"]}
    for name, entry in attack["attacks"].items():
        assert rows[name]["auc"] == entry["metrics"]["auc"]
        n_non = entry["metrics"]["n_nonmembers"]
        assert rows[name]["tpr"] == {lv: v if float(lv) * n_non >= 1 else f"not resolvable with {n_non} non-members"
                                     for lv, v in entry["metrics"]["tpr_at_fpr"].items()}


def test_glance_shows_strongest_attack_and_claim(run: Path) -> None:
    paths = _write(run)
    html = paths.html.read_text()
    attack = read_json(run / "attack.json")["attacks"]
    # 0.1 % FPR is not resolvable with the fixture's non-members: the glance reads the smallest level that is (1 %)
    assert attack["loss"]["metrics"]["n_nonmembers"] < 1000 <= 100 * attack["loss"]["metrics"]["n_nonmembers"]
    best = max(attack, key=lambda k: (attack[k]["metrics"]["tpr_at_fpr"]["0.01"], attack[k]["metrics"]["auc"]))
    tpr = attack[best]["metrics"]["tpr_at_fpr"]["0.01"]
    assert re.search(rf'data-field="strongest_tpr">{_p4(tpr)}<', html) and "TPR at 1% FPR" in html
    assert f"{best} [" in html
    eps = read_json(run / "epsilon.json")
    assert re.search(rf'data-field="best_epsilon_lb">{_e3(eps["verdict"]["best_epsilon_lb"])}<', html)
    assert 'data-field="claimed_epsilon">8.000<' in html
    metrics = read_json(run / "metrics.json")
    assert re.search(rf'data-field="test_accuracy">{_p4(metrics["test_accuracy"])}<', html)
    assert 'data-status="CONSISTENT"' in html
    g = read_json(paths.json)["glance"]
    assert g["strongest_attack"] == best and g["strongest_tpr"] == tpr


def test_epsilon_numbers_equal_epsilon_json(run: Path) -> None:
    paths = _write(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    eps = read_json(run / "epsilon.json")
    claimed = eps["claimed_epsilon"]
    for i, est in enumerate(eps["estimates"]):
        row = _row(html, "data-estimate", str(i))
        ceiling = float(est["ceiling"])
        for text in (est["method"], est["source"], _e3(est["epsilon_lb"]), _e3(ceiling),
                     f"{est['alpha']:.4g}", f"{est['delta']:.2e}", f"{est['epsilon_lb'] / claimed:.4g}"):
            assert text in row, (i, text)
        for k, v in est["counts"].items():
            assert f"{k}={v:,}" in row
        md_row = next(line for line in md.splitlines()
                      if line.startswith(f"| {est['method'].replace('_', chr(92) + '_')} |"))
        assert _e3(est["epsilon_lb"]) in md_row and _e3(ceiling) in md_row
    assert "inconclusive above ε = 6.543" in html


def test_claim_section_shows_phases_and_accountants(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", sampling="shuffle")
    html = _write(run).html.read_text()
    row = _row(html, "data-phase", "private")
    for text in ("1.1", "0.03906", "1,250", "64", "flat", "shuffle (not Poisson)"):
        assert text in row
    assert 'data-flag="non-poisson"' in html
    assert 'data-field="cross_check_epsilon">8.008' in html and "pld accountant" in html
    assert 'data-field="delta">1.00e-05<' in html
    lim = read_json(tmp_path / "r" / "report.json")["limitations"]
    assert any("Poisson" in item for item in lim)
    poisson = _write(make_run(tmp_path / "p")).html.read_text()
    assert 'data-flag="non-poisson"' not in poisson


def test_missing_files_say_not_run_with_command(tmp_path: Path) -> None:
    run = make_run(tmp_path / "bare", with_attack=False, with_epsilon=False, with_transfer=False)
    paths = _write(run)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    for section, cmd in (("attacks", f"audit attack {run}"), ("epsilon", f"audit epsilon {run}"),
                         ("transfer", f"audit transfer {run}")):
        block = re.search(rf'<div class="not-run" data-not-run="{section}">(.*?)</div>', html, flags=re.S)
        assert block and "Not run." in block.group(1) and cmd in block.group(1)
        assert f"**Not run.** Produce it with `{cmd}`." in md
    assert 'data-status="NOT_AUDITED"' in html
    assert "has not been audited yet" in html


def _model(run: Path):
    """The report's data model and its HTML without figures (fast: no matplotlib)."""
    report = build_report(load_run(run))
    return report, render_html(report, Figures())


def test_verdicts_and_caveats(tmp_path: Path) -> None:
    _, html = _model(make_run(tmp_path / "v", epsilon=2.0, epsilon_lb=3.5, ceiling=9.0))
    assert 'data-status="VIOLATION"' in html and "at least 3.500, above the claimed ε = 2.000" in html
    nodp, html = _model(make_run(tmp_path / "n", dp=False))
    assert 'data-status="NO_CLAIM"' in html and 'data-field="claimed_epsilon">none<' in html
    assert any("without differential privacy" in item for item in nodp.limitations)
    assert nodp.epsilon.claimed_epsilon == math.inf  # "inf" in epsilon.json is parsed back to a float
    weak, _ = _model(make_run(tmp_path / "w", delta=0.05, n_reference=4, ceiling=5.0))
    lim = " ".join(weak.limitations)
    assert "not below 1/n" in lim and "Only 4 reference models" in lim and "inconclusive" in lim
    strong, _ = _model(make_run(tmp_path / "s", n_reference=64, ceiling=20.0))
    lim = " ".join(strong.limitations)
    assert "not below 1/n" not in lim and "reference model" not in lim and "inconclusive" not in lim
    assert "lower bounds" in lim
    only_loss, _ = _model(make_run(tmp_path / "l", attacks=("loss", "attack_p"), n_reference=0))
    assert any("Only reference-free attacks" in item for item in only_loss.limitations)


def test_non_finite_strings_are_parsed(tmp_path: Path) -> None:
    run = make_run(tmp_path / "nf")
    update_json(run, "attack.json", lambda d: d["attacks"]["loss"]["metrics"].__setitem__("auc", "nan"))
    html = _write(run).html.read_text()
    assert "n/a" in _row(html, "data-attack", "loss")
    assert "∞" in _row(html, "data-estimate", "1")


def test_html_is_self_contained(run: Path) -> None:
    html = _write(run, images=PoolImages(x=pool_arrays(200)[0], y=pool_arrays(200)[1],
                                         classes=tuple("abcdefghij"))).html.read_text()
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html.lower() and "<link" not in html.lower() and "@import" not in html
    for src in re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', html):
        assert src.startswith("data:") or src.startswith("#"), src
    for target in re.findall(r"url\(\s*['\"]?([^)'\"]*)", html):
        assert target.startswith("#") or target.startswith("data:"), target
    assert html.count("<svg") == 3  # ROC, epsilon bars, transfer diagnostics


def test_thumbnails_are_inline_pngs(run: Path) -> None:
    x, y = pool_arrays(200)
    paths = write_report(run_dir=run, images=PoolImages(x=x, y=y, classes=tuple(f"c{i}" for i in range(10))))
    html = paths.html.read_text()
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    strongest = read_json(paths.json)["attacks"]["strongest"]
    vulnerable = read_json(run / "attack.json")["attacks"][strongest]["most_vulnerable"]
    assert len(uris) == len(vulnerable)
    from PIL import Image

    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(uris[0]))).convert("RGB"))
    assert first.shape == (64, 64, 3)
    assert np.array_equal(first[::8, ::8], x[vulnerable[0]])  # nearest-neighbour upscale of the pool image


def test_thumbnails_need_a_pool_that_verifies_else_indices(tmp_path: Path) -> None:
    run = make_run(tmp_path / "img")  # its config.yaml is not the one the manifest records
    html = write_report(run_dir=run).html.read_text()
    assert "data:image/png" not in html and "could not be re-loaded" in html and "config sha256" in html
    assert "Pool indices:" in html


def test_thumbnails_with_the_real_digits_loader(tmp_path: Path) -> None:
    from training.config import DataConfig
    from training.data import load_pool
    from foundation.io import sha256_file

    cfg = {"dataset": "digits", "pool_size": 60, "test_split": None}
    pool = load_pool(DataConfig.model_validate(cfg))  # scikit-learn's bundled digits: always available
    run = make_run(tmp_path / "digits", dataset="digits", pool=(np.asarray(pool.x), np.asarray(pool.y)),
                   config_data=cfg)
    update_json(run, "manifest.json",
                lambda m: m["provenance"].update(config_sha256=sha256_file(run / "config.yaml")))
    html = write_report(run_dir=run).html.read_text()
    assert html.count('src="data:image/png;base64,') == 8


def test_cli_report_writes_files_and_bad_input_exits_2(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["report", str(run), "--out", str(out), "--no-images"])
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir()} == {"report.html", "report.md", "report.json"}
    assert "CONSISTENT" in res.output
    (run / "epsilon.json").write_text("{not json")
    res = CliRunner().invoke(main, ["report", str(run), "--no-images"])
    assert res.exit_code == 2 and "epsilon.json" in res.output
    res = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "run directory not found" in res.output


def test_pdf_without_chromium_is_a_user_error(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("audit.reporting.chromium.find_chromium", lambda: None)
    res = CliRunner().invoke(main, ["report", str(run), "--pdf", "--no-images"])
    assert res.exit_code == 2 and "needs Chromium" in res.output


CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(headless_args(CHROMIUM, profile) + args, capture_output=True, text=True, timeout=90)


@needs_chromium
def test_renders_in_headless_chromium(run: Path, tmp_path: Path) -> None:
    paths = _write(run)
    shot = tmp_path / "shot.png"
    proc = _chromium(["--hide-scrollbars", "--window-size=1100,2400", "--enable-logging=stderr", "--v=0",
                      f"--screenshot={shot}", paths.html.resolve().as_uri()], tmp_path / "profile1")
    assert shot.is_file(), proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.shape == (2400, 1100)
    assert pixels.std() > 10.0  # not blank
    assert (pixels < 100).mean() > 0.005  # some dark text was drawn
    dom = _chromium(["--enable-logging=stderr", "--v=0", "--dump-dom", paths.html.resolve().as_uri()],
                    tmp_path / "profile2")
    assert all(f'data-section="{s}"' in dom.stdout for s in SECTIONS)
    assert dom.stdout.count("<svg") == 3
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []


@needs_chromium
def test_cli_pdf(run: Path) -> None:
    res = CliRunner().invoke(main, ["report", str(run), "--pdf", "--no-images"])
    assert res.exit_code == 0, res.output
    pdf = (run / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000


def test_report_json_is_plain_json(run: Path) -> None:
    paths = _write(run)
    data = json.loads(paths.json.read_text())  # standard JSON (no NaN/Infinity tokens)
    assert data["epsilon"]["rows"][1]["ceiling"] == "inf"
    assert data["provenance"]["commands"][1] == f"audit attack {run}"


def test_reads_what_audit_attack_writes_without_bootstrap(tmp_path: Path) -> None:
    """An attack evaluated with n_boot = 0 (no intervals) by the writer's own evaluate_scores is reported."""
    from attacks.attack_file import AttackEntry, read_attack_file, write_attack_file
    from attacks.results import evaluate_scores

    run = make_run(tmp_path / "w")
    rng = np.random.default_rng(3)
    y = rng.random(200) < 0.5
    entry = AttackEntry.from_data({"params": {"attack": "loss"}, **evaluate_scores(
        rng.normal(size=200) + y, y, rng.integers(0, 10, 200), n_boot=0, seed=0, top_k=4)})
    assert entry.metrics.auc_ci is None and entry.metrics.tpr_at_fpr_ci == {}
    old = read_attack_file(run)
    write_attack_file(run, old.model_copy(update={"attacks": {"loss": entry}}),
                      identity=evidence_identity(read_manifest(run), claim=False))
    html = _write(run).html.read_text()
    assert _p4(entry.metrics.auc) in _row(html, "data-attack", "loss")
    best = read_json(run / "report.json")["attacks"]["strongest"]
    assert best == "loss"
    level = "0.001" if entry.metrics.n_nonmembers >= 1000 else "0.01"   # the smallest resolvable glance level
    tpr = entry.metrics.tpr_at_fpr[level]
    assert f'data-field="strongest_tpr">{_p4(tpr)}<' in html


def test_an_epsilon_json_of_format_1_is_migrated_and_reported_alike(tmp_path: Path) -> None:
    run = make_run(tmp_path / "v1", epsilon_lb=9.5, ceiling=12.0)
    new_html = _write(run).html.read_text()

    def to_v1(d: dict) -> None:
        d["format"] = "dp-audit-epsilon/1"
        for key in ("claimed_epsilon", "claimed_delta", "violating", "findings"):
            d["verdict"].pop(key)

    update_json(run, "epsilon.json", to_v1)
    assert _write(run).html.read_text() == new_html
    assert 'data-status="VIOLATION"' in new_html


def test_a_transfer_json_with_datasets_as_a_mapping_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path / "m")
    update_json(run, "transfer.json", lambda d: d.update(datasets={"cifar10": {"status": "ok"}}))
    res = CliRunner().invoke(main, ["report", str(run), "--no-images"])
    assert res.exit_code == 2
    assert "transfer.json" in res.output and "'datasets'" in res.output and f"audit transfer {run}" in res.output


def test_a_failed_write_leaves_no_mix_of_old_and_new_report_files(run: Path, monkeypatch) -> None:
    """report.html, report.md and report.json are one unit: a full disk at the Markdown leaves none of them (an
    HTML of this audit beside the Markdown of an older one would be worse than no report), and the next call
    writes all three."""
    import audit.reporting as reporting

    _write(run)
    (run / "report.md").write_text("an older report")
    real = reporting.write_text

    def full_at_markdown(path, text):
        if Path(path).name == "report.md":
            raise OSError(28, "No space left on device", str(path))
        return real(path, text)

    monkeypatch.setattr(reporting, "write_text", full_at_markdown)
    with pytest.raises(OSError):
        _write(run)
    assert not any((run / name).exists() for name in ("report.html", "report.md", "report.json"))
    monkeypatch.setattr(reporting, "write_text", real)
    paths = _write(run)
    assert paths.markdown.read_text().startswith("# ") and paths.html.is_file() and paths.json.is_file()
