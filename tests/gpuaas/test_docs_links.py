"""Links between the docs resolve: the file exists, and the #anchor is a heading of it (GitHub's slugs)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuaas.configref import github_anchor as slug

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    """The Markdown without fenced code blocks (links in code are not links)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    for line in prose(path).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            base = slug(m.group(1))
            name, n = base, 0
            while name in out:  # a repeated heading gets -1, -2, ...
                n += 1
                name = f"{base}-{n}"
            out.add(name)
    return out


def test_slug_follows_github():
    assert slug("Measured (2026-11-21, this 2-core machine)") == "measured-2026-11-21-this-2-core-machine"
    assert slug("The controller: `gpuaas autoscaler --config FILE`") == "the-controller-gpuaas-autoscaler---config-file"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
