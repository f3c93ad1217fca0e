"""File names of a run directory are spelt once, in :mod:`foundation.files`; every other module imports them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import foundation.files as files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("foundation", "training", "attacks", "audit")
SKIP = ("foundation/files.py",)  # the seed-paper research (experiments/) is outside PACKAGES
NAMES = sorted({v for k in files.__all__ if isinstance(v := getattr(files, k), str) and k.isupper()}
               - {files.STATE_DIR, files.TB_DIR}, key=len, reverse=True)  # "state", "tb": common words


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def spelt_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string literal (docstrings aside) that spells a file name of :mod:`foundation.files`.

    >>> spelt_names('p = run / "scores.npz"\\nq = f"{run}/shadows/{k}"\\n"manifest.json is prose here"')
    [(1, 'scores.npz'), (2, 'shadows')]
    """
    tree = ast.parse(source)
    docs = _docstrings(tree)
    names = "|".join(map(re.escape, NAMES))
    whole = re.compile(rf"(?:^|/)({names})(?:$|/)")
    piece = re.compile(rf"/({names})(?:$|/)")  # inside an f-string: "{run}/shadows/" is one, "{x}.lock" is not
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            pattern = piece if id(node) in pieces else whole
            found += [(node.lineno, m.group(1)) for m in pattern.finditer(node.value)]
    return sorted(found)


def test_every_run_file_name_is_spelt_only_in_foundation_files():
    hits = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIP):
                continue
            hits += [f"{rel}:{line}: {name!r}" for line, name in spelt_names(path.read_text())]
    assert not hits, "spell these with the constants of foundation.files:\n" + "\n".join(hits)


def test_the_scan_finds_a_spelt_name():
    assert spelt_names('x = root / "keep.npy"') == [(1, "keep.npy")]
    assert spelt_names('x = "gradient_canaries.npy"') == [(1, "gradient_canaries.npy")]
    assert spelt_names('x = f"sigma-{d}.lock"') == []
