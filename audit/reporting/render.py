"""Render a :class:`audit.reporting.model.Report` as one self-contained HTML file and as Markdown.

The templates (``report.html.j2``, ``report.md.j2``) and the stylesheet (``report.css``) are package data.
The HTML inlines its CSS, its SVG figures and its thumbnails (``data:`` URIs); it runs no JavaScript and loads
nothing from the network. Every number goes through :mod:`audit.reporting.fmt`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
from typing import Any

import jinja2
from markupsafe import Markup

from audit.reporting import fmt
from audit.reporting.model import Figures, Report

__all__ = ["render_html", "render_markdown", "render_json"]


def _version() -> str:
    try:
        return importlib.metadata.version("dp-audit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _template_source(name: str) -> str:
    return (importlib.resources.files("audit.reporting") / name).read_text(encoding="utf-8")


def _md(text: Any) -> str:
    r"""Escape a value for a Markdown table cell or paragraph (pipes, newlines, emphasis markers, and the
    brackets of a link, so ``[x](javascript:...)`` from a run directory stays text).

    >>> print(_md("[x](javascript:alert(1)) <b>"))
    \[x\]\(javascript:alert\(1\)\) \<b\>
    """
    s = " ".join(str(text).split())
    for ch in ("\\", "|", "*", "_", "`", "<", ">", "[", "]", "(", ")", "!"):
        s = s.replace(ch, "\\" + ch)
    return s


def _mdcode(text: Any) -> str:
    """A value for a Markdown code span inside a table cell (no backticks; pipes escaped)."""
    return " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")


def _environment(*, autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=not autoescape,
        lstrip_blocks=not autoescape,
        keep_trailing_newline=True,
    )
    env.filters.update(prob=fmt.prob, pct=fmt.pct, eps=fmt.eps, sci=fmt.sci, num=fmt.num, count=fmt.count,
                       ci=fmt.ci, fpr_label=fmt.fpr_label, md=_md, mdcode=_mdcode)
    return env


def render_html(report: Report, figures: Figures) -> str:
    """The report as one self-contained HTML document.

    Args:
        report: the filled data model.
        figures: inline SVG figures (any may be None).

    Returns:
        The HTML text.
    """
    template = _environment(autoescape=True).get_template("report.html.j2")
    return template.render(r=report, figures=figures, css=Markup(_template_source("report.css")),
                           version=_version())


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured Markdown (tables; figures stay in the HTML)."""
    template = _environment(autoescape=False).get_template("report.md.j2")
    text = template.render(r=report, version=_version())
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text


def render_json(report: Report) -> dict[str, Any]:
    """The structured data the report shows (numbers unrounded, as in the run's JSON files)."""
    return report.to_dict()
