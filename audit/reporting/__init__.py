"""The audit report: one self-contained document per run directory.

``write_report(run_dir=...)`` reads the run's files (:mod:`audit.reporting.inputs`), builds the data model
(:mod:`audit.reporting.build`), draws the figures (:mod:`audit.reporting.figures`) and writes ``report.html`` (inline
CSS, SVG and thumbnails; no JavaScript, no network), ``report.md`` and ``report.json``, and optionally
``report.pdf`` via headless Chromium (:mod:`audit.reporting.chromium`).

Sections, in order: verdict at a glance, the claim, threat model, attacks, ε lower bounds, utility and transfer,
provenance and reproduction, limitations. A section whose input file is absent says "Not run" and gives the
command that produces it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from audit.reporting.build import ATTACK_INFO, build_report
from audit.reporting.chromium import print_pdf
from audit.reporting.figures import epsilon_svg, roc_svg, transfer_svg
from audit.reporting.images import PoolImages, load_pool_images
from audit.reporting.inputs import RunFiles, load_run
from audit.reporting.model import Figures, Report
from audit.reporting.render import render_html, render_json, render_markdown
from foundation.files import REPORT_HTML_FILE, REPORT_JSON_FILE, REPORT_MD_FILE, REPORT_PDF_FILE
from foundation.io import all_or_nothing, write_json, write_text
from training.run import VerifiedRun

__all__ = ["ReportPaths", "Report", "Figures", "PoolImages", "build_report", "make_figures", "load_run",
           "render_html", "render_markdown", "render_json", "write_report"]


@dataclass(frozen=True, kw_only=True)
class ReportPaths:
    """Files written by :func:`write_report` (``pdf`` is None unless requested)."""

    html: Path
    markdown: Path
    json: Path
    pdf: Path | None
    report: Report


def make_figures(run: RunFiles, report: Report) -> Figures:
    """Draw the report's SVG figures from the run's files and the built report."""
    names = {k: v[0] for k, v in ATTACK_INFO.items()}
    levels = [float(lv) for lv in report.attacks.levels]
    return Figures(
        roc=roc_svg(run.attack, names=names, levels=levels) if run.attack is not None else None,
        epsilon=epsilon_svg(report.epsilon.rows, claimed=report.epsilon.claimed_epsilon)
        if report.epsilon.ran else None,
        transfer=transfer_svg(report.utility.transfer) if report.utility.transfer_ran else None,
    )


def write_report(*, run_dir: str | os.PathLike[str] | VerifiedRun, out_dir: str | os.PathLike[str] | None = None,
                 pdf: bool = False, images: PoolImages | None = None, load_images: bool = True,
                 generated: str | None = None) -> ReportPaths:
    """Write ``report.html``, ``report.md`` and ``report.json`` (and ``report.pdf``) for a run directory.

    Args:
        run_dir: a run directory (``manifest.json`` required; other files optional), or the run already opened
            with :func:`training.run.open_run`.
        out_dir: where to write (default: ``run_dir``).
        pdf: also print ``report.pdf`` with headless Chromium.
        images: the training pool's images for thumbnails; when None and ``load_images`` is True they are the
            run's verified pool (indices are listed, with the reason, if it cannot be rebuilt).
        load_images: use the run's pool when ``images`` is None.
        generated: timestamp shown in the report (default: now, UTC).

    Returns:
        The paths written and the report's data model.

    Raises:
        UserError: the run directory or one of its files is missing or malformed, or ``pdf`` is requested and
            Chromium is missing or fails.
    """
    run = load_run(run_dir)
    note = ""
    if images is None:
        if load_images:
            images, note = load_pool_images(run)
        else:
            note = "image loading was switched off"
    report = build_report(run, images=images, images_note=note, generated=generated)
    figures = make_figures(run, report)
    out = Path(out_dir) if out_dir is not None else run.run_dir
    html, markdown, as_json = render_html(report, figures), render_markdown(report), render_json(report)
    unit = (out / REPORT_HTML_FILE, out / REPORT_MD_FILE, out / REPORT_JSON_FILE)
    with all_or_nothing(out, files=unit):  # a failed write leaves no report.html of this run beside an older .md
        html_path, md_path = write_text(unit[0], html), write_text(unit[1], markdown)
        json_path = write_json(unit[2], as_json)
    pdf_path = print_pdf(html_path=html_path, pdf_path=out / REPORT_PDF_FILE) if pdf else None
    return ReportPaths(html=html_path, markdown=md_path, json=json_path, pdf=pdf_path, report=report)
