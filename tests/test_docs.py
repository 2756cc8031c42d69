"""Every ```python example in README.md and docs/*.md runs, and the docs site builds strictly."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file as ``(first line number, source)``.

    Raises:
        ValueError: a fence is never closed, or a block is tagged ``py``/``pycon``/...
            instead of ``python`` (it would silently go untested).
    """
    blocks: list[tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    lang = ""
    start = 0
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        if fence is None:
            m = _FENCE.match(line)
            if m:
                fence, lang, start, body = m.group(1), m.group(2).lower(), number + 1, []
                if lang.startswith("py") and lang != "python":
                    raise ValueError(f"{path.name}:{number}: tag code as ```python, not {lang!r}")
        elif line.strip() == fence:
            if lang == "python":
                blocks.append((start, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    if fence is not None:
        raise ValueError(f"{path.name}:{start - 1}: code fence is never closed")
    return blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(page: Path) -> None:
    """A page's ```python blocks run in order in one namespace, their asserts holding."""
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for start, source in python_blocks(page):
        # Pad so that a traceback points at the page's own line numbers.
        code = compile("\n" * (start - 1) + source, str(page), "exec")
        exec(code, namespace)


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict`` succeeds: no broken links, no page left out of the nav."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    # Docstrings are Markdown: no reST role may reach a page as raw text.
    raw_role = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|ref):")
    leaks = {
        str(page.relative_to(tmp_path / "site")): raw_role.findall(page.read_text())
        for page in (tmp_path / "site").rglob("*.html")
    }
    assert {page: found for page, found in leaks.items() if found} == {}
