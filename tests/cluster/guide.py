"""The cluster guide's commands, as its reader runs them: the shell block under a
heading of docs/guides/cluster.md, each command one line (continuations joined,
comments and the output lines shown after `#` dropped), its placeholders
(registry.example.com, the digests shown as `sha256:d690...`) replaced by what a
test cluster has. The journey test (tests/cluster/test_e2e.py) runs these, so a
guide that names a flag, a value or a file the product does not have fails it.
Pure: parsing and substitution only."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "cluster.md"
REGISTRY = "registry.example.com/ml/rljob"  # the guide's registry path


def commands(heading: str, page: Path = GUIDE) -> list[str]:
    """The commands of the first ```sh block under the `## heading` of `page`."""
    text = page.read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if section is None:
        raise ValueError(f"{page.name}: no section '## {heading}'")
    block = re.search(r"^```sh\n(.*?)^```", section.group(1), re.M | re.S)
    if block is None:
        raise ValueError(f"{page.name}: no ```sh block under '## {heading}'")
    joined = re.sub(r"\\\n\s*", " ", block.group(1))  # continuation lines, and
    joined = re.sub(r"\n\s*\|", " |", joined)  # a pipe that starts the next line
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # comments, output shown after #
        if line:
            out.append(" ".join(line.split()))
    return out


def command(heading: str, start: str, page: Path = GUIDE) -> str:
    """The one command of the section that starts with `start`."""
    found = [c for c in commands(heading, page) if c.startswith(start)]
    if len(found) != 1:
        raise ValueError(f"{page.name}, '## {heading}': {len(found)} commands start with "
                         f"{start!r}: {commands(heading, page)}")
    return found[0]


def argv(line: str, subs: dict[str, str]) -> list[str]:
    """`line` split as the shell splits it, each placeholder of `subs` replaced in each
    word (a word that is a placeholder whole, or contains one)."""
    words = shlex.split(line)
    for old, new in subs.items():
        words = [w.replace(old, new) for w in words]
    return words
