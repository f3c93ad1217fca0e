"""README's "Layout" agrees with the tree: every module and folder it names exists where it puts it, and every
package that ships (pyproject's ``packages.find``) and every sub-package of ours is listed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NAMED = re.compile(r"[\w/]+\.py\b|\b\w+/(?=[\s,;)]|$)")  # "writer.py", "run/writer.py", "bounds/"


def _layout() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Layout", 1)[1].split("```", 2)[1].splitlines()


def _named() -> list[tuple[str, str | None, str]]:
    """(top-level folder, sub-folder or None, name) of every module or folder the block names, with the folders
    the line stands under: a name at column 0 opens a top-level folder, at column 2 an entry of it."""
    out, top, sub = [], "", None
    for line in filter(str.strip, _layout()):
        indent, head = len(line) - len(line.lstrip()), line.split()[0]
        if indent == 0:
            top, sub = head.rstrip("/"), None
        elif indent == 2:
            sub = head.rstrip("/") if head.endswith("/") else None
        out += [(top, sub, name) for name in _NAMED.findall(line) if not name.startswith("results/")]
    return out


def test_every_name_in_the_layout_exists_where_it_stands():
    missing = [f"{top}/{sub or ''} {name}" for top, sub, name in _named()
               if not any((base / name).exists() for base in (ROOT, ROOT / top, ROOT / top / (sub or "")))]
    assert not missing, missing


def test_every_shipped_package_and_subpackage_is_listed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    tops = {line.split()[0].rstrip("/") for line in _layout() if line.strip() and not line[0].isspace()}
    assert set(shipped) <= tops, set(shipped) - tops
    folders = {(top, name.rstrip("/").split("/")[-1]) for top, _, name in _named() if name.endswith("/")}
    unlisted = [str(init.parent.relative_to(ROOT)) for pkg in shipped for init in (ROOT / pkg).glob("*/__init__.py")
                if (pkg, init.parent.name) not in folders]
    assert not unlisted, f"packages the Layout does not list: {unlisted}"
