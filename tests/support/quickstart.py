"""A Markdown page's quickstart run as written (README's, docs/doctor.md's): each python block written to the file its
first line names (`# file: NAME`), each line of a bash block run in order in an empty directory with this Python's
`align` first on PATH, each exit code the one its `# exit N` comment gives (0 where none), and every output the prose
after a block quotes found in what that block printed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.M | re.S)
EXIT = re.compile(r"#\s*exit (\d+)")
QUOTE = re.compile(r"`([^`]*\s\.\.\.(?:\s[^`]*)?)`")  # quoted output, abridged with " ... " (not `f(...)`)
CUT = re.compile(r"\s\.\.\.(?:\s|$)")


def section(page: Path, heading: str = "Quickstart") -> str:
    """The text of a page's `## {heading}` section."""
    return page.read_text(encoding="utf-8").split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0] + "\n"


def steps(text: str) -> list[tuple[str, str, str]]:
    """(language, block body, the prose after the block up to the next block) for each fenced block, in order."""
    blocks = list(FENCE.finditer(text))
    ends = [b.start() for b in blocks[1:]] + [len(text)]
    return [(b.group(1), b.group(2), text[b.end():end]) for b, end in zip(blocks, ends)]


def run_quickstart(text: str, workdir: Path, quotes: tuple[re.Pattern[str], ...] = (QUOTE,)) -> tuple[int, int]:
    """Run a quickstart section in `workdir` (on PYTHONPATH, for the files it writes); (commands run, quoted pieces
    found). `quotes`: the patterns whose first group is an output the prose quotes (" ... " cuts it into pieces)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(workdir))
    ran = quoted = 0
    for language, body, prose in steps(text):
        if language == "python":
            first, _, code = body.partition("\n")
            name = first.removeprefix("# file: ")
            assert name != first, f"a python block of the quickstart names no file: {first!r}"
            (workdir / name).write_text(code, encoding="utf-8")
            continue
        assert language == "bash", language
        printed = ""
        for line in filter(None, body.splitlines()):
            code = EXIT.search(line)
            proc = subprocess.run(line, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode == (int(code.group(1)) if code else 0), (line, proc.stdout, proc.stderr)
            printed += proc.stdout + proc.stderr
            ran += 1
        flat = " ".join(printed.split())
        for quote in (q for pattern in quotes for q in pattern.findall(prose)):
            for piece in filter(None, (p.strip() for p in CUT.split(" ".join(quote.split())))):
                assert piece in flat, (piece, printed)
                quoted += 1
    return ran, quoted
