"""mkdocs hooks (mkdocs.yml `hooks:`): the site's home page is README.md, and its API page lists `aligner._API`.

README.md stays the one source of the first-hour guide: the home page is its text with `docs/PAGE.md` links made
relative to the site, so `mkdocs build --strict` checks README's links and anchors with the pages'. The API page
is built from `_API` in aligner/__init__.py, read as text (nothing is imported), so a name added there or a module
moved shows up without editing the page. A repository path a page names in backticks (`aligner/core/files.py`,
`tests/faults/test_faults.py`, `mappings/check_rules.yaml`) must exist: a module moved without its docs fails the build.
"""
from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOG = logging.getLogger("mkdocs.hooks.aligner")  # under "mkdocs": a warning fails --strict
REPO_PATH = re.compile(r"`((?:aligner|tests|scripts|mappings|docs)/[\w./-]*\w)(?:::\w+)?`")
API_MARKER = "<!-- api: generated from aligner._API by scripts/docs_hooks.py -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """The home page's text is README.md's; the API page's marker becomes one mkdocstrings block per public name."""
    if page.file.src_uri == "index.md":
        markdown = re.sub(r"\]\(docs/", "](", (ROOT / "README.md").read_text(encoding="utf-8"))
    elif page.file.src_uri == "api.md":
        markdown = markdown.replace(API_MARKER, api_blocks())
    for path in sorted(set(REPO_PATH.findall(markdown))):
        if not (ROOT / path).exists():
            LOG.warning("Doc file '%s' names `%s`, which is not in the repository", page.file.src_uri, path)
    return markdown


def api_blocks() -> str:
    """`::: module.name` for each public name of aligner, in `_API`'s order, titled as users call it."""
    blocks = []
    for name, module in public_api().items():
        target = wrapped_target(module, name) or f"{module}.{name}"
        blocks.append(f"::: {target}\n    options:\n      heading: \"aligner.{name}\"\n      toc_label: \"{name}\"\n")
    return "\n".join(blocks)


def public_api() -> dict[str, str]:
    """`_API` of aligner/__init__.py: public name -> the module that defines it."""
    tree = ast.parse((ROOT / "aligner" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_API" for t in node.targets):
            return dict(ast.literal_eval(node.value))
    raise RuntimeError("aligner/__init__.py has no _API")


def wrapped_target(module: str, name: str) -> str | None:
    """The function a `@functools.wraps(f)` wrapper documents (aligner.api's dump and compare), else None."""
    path = ROOT.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func) in ("functools.wraps", "wraps"):
                    return imported.get(ast.unparse(deco.args[0]))
    return None
