"""README's quickstart, run as written: its files written, its commands run in order in an empty directory, each exit
code the one its `# exit N` comment gives (0 where none), and every output the prose quotes found in what the
command block before it printed. A step that stops working, or an output the README misquotes, fails here."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.M | re.S)
EXIT = re.compile(r"#\s*exit (\d+)")
QUOTE = re.compile(r"`([^`]*\s\.\.\.(?:\s[^`]*)?)`")  # quoted output, abridged with " ... " (not `f(...)`)
CUT = re.compile(r"\s\.\.\.(?:\s|$)")


def quickstart() -> str:
    """The text of README's quickstart section."""
    return README.read_text(encoding="utf-8").split("\n## Quickstart", 1)[1].split("\n## ", 1)[0] + "\n"


def steps(section: str) -> list[tuple[str, str, str]]:
    """(language, block body, the prose after the block up to the next block) for each fenced block, in order."""
    blocks = list(FENCE.finditer(section))
    ends = [b.start() for b in blocks[1:]] + [len(section)]
    return [(b.group(1), b.group(2), section[b.end():end]) for b, end in zip(blocks, ends)]


def test_the_quickstart_runs_as_written(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(tmp_path))
    ran, quoted = 0, 0
    for language, body, prose in steps(quickstart()):
        if language == "python":
            first, _, code = body.partition("\n")
            name = first.removeprefix("# file: ")
            assert name != first, f"a python block of the quickstart names no file: {first!r}"
            (tmp_path / name).write_text(code, encoding="utf-8")
            continue
        assert language == "bash", language
        printed = ""
        for line in filter(None, body.splitlines()):
            code = EXIT.search(line)
            proc = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == (int(code.group(1)) if code else 0), (line, proc.stdout, proc.stderr)
            printed += proc.stdout + proc.stderr
            ran += 1
        flat = " ".join(printed.split())
        for quote in QUOTE.findall(prose):
            for piece in filter(None, (p.strip() for p in CUT.split(" ".join(quote.split())))):
                assert piece in flat, (piece, printed)
                quoted += 1
    assert ran >= 12 and quoted >= 5, (ran, quoted)  # the section was read: every step's command and quotes
