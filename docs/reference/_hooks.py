"""mkdocs hook: every public name of sendonce has a docstring, or the strict build fails.

The reference renders each name of the public modules' ``__all__`` from its docstring;
one without a docstring would be a bare signature. mkdocstrings does not refuse it, so
this hook does: it loads the package with griffe (what mkdocstrings reads, attribute
docstrings included) and logs a warning per missing docstring, which ``--strict`` (set in
mkdocs.yml) turns into a failed build.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import griffe

log = logging.getLogger("mkdocs.hooks.public_docstrings")

PUBLIC_MODULES = [
    "sendonce",
    "sendonce.errors",
    "sendonce.backends",
    "sendonce.backends.local",
    "sendonce.ledger",
    "sendonce.outbox",
    "sendonce.aio",
    "sendonce.spark",
    "sendonce.testing",
    "sendonce.emulator",
    "sendonce.telemetry",
]


def undocumented(src: Path, modules: list[str] = PUBLIC_MODULES) -> list[str]:
    """``module.name`` of each public name of ``modules`` (in the package under ``src``)
    whose docstring is missing or empty."""
    package = griffe.load("sendonce", search_paths=[str(src)], resolve_aliases=True)
    missing = []
    for dotted in modules:
        module = package if dotted == "sendonce" else package[dotted.removeprefix("sendonce.")]
        for export in module.exports or ():
            name = export if isinstance(export, str) else export.name
            try:
                member = module[name]
                target = member.final_target if member.is_alias else member
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                missing.append(f"{dotted}.{name} (cannot be resolved)")
                continue
            if target.docstring is None or not target.docstring.value.strip():
                missing.append(f"{dotted}.{name}")
    return missing


def on_pre_build(config: Any, **kwargs: Any) -> None:
    src = Path(config["config_file_path"]).parent / "src"
    for name in undocumented(src):
        log.warning("public name without a docstring: %s", name)


# The docstrings cross-reference in reST (``:class:`~sendonce.errors.InDoubtError```), which
# Markdown renders as the role's name followed by code: keep the code, as Sphinx would show it
# (``~`` shows the last part of the dotted name only).
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_shown, html)
