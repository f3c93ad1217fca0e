"""Print the HTML report to PDF with headless Chromium.

Chromium runs with a throw-away profile and every background network feature switched off; the report itself
loads nothing from the network, so printing works offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from foundation.errors import UserError
from foundation.io import atomic_path

__all__ = ["CHROMIUM_NAMES", "find_chromium", "headless_args", "print_pdf"]

#: Executable names tried, in order, on PATH (then ``/usr/bin/chromium``).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium executable, or None when none is installed."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def headless_args(executable: str, user_data_dir: str | os.PathLike[str]) -> list[str]:
    """The command-line prefix for an isolated, offline headless Chromium.

    >>> headless_args("chromium", "/tmp/p")[:3]
    ['chromium', '--headless', '--no-sandbox']
    """
    return [executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={user_data_dir}"]


def print_pdf(*, html_path: str | os.PathLike[str], pdf_path: str | os.PathLike[str],
              timeout: float = 120.0) -> Path:
    """Print ``html_path`` to ``pdf_path`` (written atomically) with headless Chromium.

    Args:
        html_path: the self-contained HTML report.
        pdf_path: where to write the PDF.
        timeout: seconds before Chromium is stopped.

    Returns:
        ``pdf_path``.

    Raises:
        UserError: Chromium is not installed, fails, times out or writes no PDF.
    """
    exe = find_chromium()
    if exe is None:
        raise UserError("--pdf needs Chromium, which was not found on PATH: install it (e.g. 'apt-get install "
                        "chromium') or drop --pdf and print report.html from a browser")
    html = Path(html_path).resolve()
    pdf_path = Path(pdf_path)
    with tempfile.TemporaryDirectory(prefix="dp-audit-chromium-") as profile, atomic_path(pdf_path) as tmp:
        cmd = headless_args(exe, profile) + ["--no-pdf-header-footer", f"--print-to-pdf={tmp}", html.as_uri()]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise UserError(f"Chromium did not finish printing {html} within {timeout:.0f} s; retry, or print "
                            f"report.html from a browser") from None
        if proc.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
            tail = " ".join(proc.stderr.strip().splitlines()[-2:])[-300:]
            raise UserError(f"Chromium failed to print {html} to PDF (exit {proc.returncode}): {tail}")
    return pdf_path
