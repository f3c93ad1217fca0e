"""Rules of the tree that a review would otherwise check by hand (issue 33): tests import the project as installed
or from the checkout root, never by editing ``sys.path``; the public API has no callable-module shim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: an edit of the import path by hand: sys.path.insert/append/extend/remove, item or slice assignment, ``+=``
_SYS_PATH_EDIT = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b|\[[^\]]*\]\s*=|\+?=)")


def test_no_test_edits_sys_path():
    """A test that needs a user's module importable uses pytest's ``monkeypatch.syspath_prepend`` (undone after
    it); none adds a project folder (benchmarks/, examples/) to the path."""
    tests = [p for p in sorted((ROOT / "tests").glob("*.py")) if p.name != Path(__file__).name]  # not its examples
    edits = [f"{path.name}:{n}" for path in tests
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if _SYS_PATH_EDIT.search(line)]
    assert not edits, edits


def test_the_pattern_sees_the_edits_it_names():
    for line in ("sys.path.insert(0, str(ROOT))", "sys.path.append(p)", "sys.path[:0] = [p]", "sys.path += [p]",
                 "sys.path = [p]", "sys.path.remove(p)"):
        assert _SYS_PATH_EDIT.search(line), line
    assert not _SYS_PATH_EDIT.search('"""the code folder on sys.path."""')


def test_no_callable_module_shim():
    assert not (ROOT / "audit" / "_callable.py").exists()
    assert not [p for p in (ROOT / "audit").rglob("*.py") if "_callable" in p.read_text(encoding="utf-8")]
