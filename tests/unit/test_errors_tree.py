"""The error tree drawn in ``sendonce.errors`` and docs/index.md is the tree of the real classes.

Every ``SendOnceError`` subclass that the package defines must appear once, under its real
parent, with its other bases as ``(also X)`` and, when it is not in ``sendonce.errors``, the
public module it is imported from as ``[module]``. Adding a class without drawing it fails here.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import sendonce
import sendonce.errors
from sendonce.errors import SendOnceError

INDEX = Path(__file__).resolve().parents[2] / "docs" / "index.md"
BRANCH = re.compile(r"^(?P<prefix>(?:│   |    )*(?:├── |└── )?)(?P<rest>\S.*)$")
NODE = re.compile(
    r"^(?P<name>[A-Za-z]\w*)(?: \(also (?P<also>\w+(?:, \w+)*)\))?"
    r"(?: \[(?P<module>[\w.]+)\])?\s+— (?P<why>\S.*)$"
)


@dataclass(frozen=True)
class Drawn:
    name: str
    parent: str | None
    also: tuple[str, ...]
    module: str


def tree_lines(text: str) -> list[str]:
    """The lines of the first drawing that starts with ``SendOnceError``, to its end."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SendOnceError "))
    ends = (i for i in range(start, len(lines)) if lines[i].strip() in ("", "```"))
    end = next(ends, len(lines))
    return lines[start:end]


def parse(lines: list[str]) -> list[Drawn]:
    drawn: list[Drawn] = []
    stack: list[str] = []
    for line in lines:
        branch = BRANCH.match(line)
        assert branch, f"not a tree line: {line!r}"
        depth = len(branch["prefix"]) // 4
        node = NODE.match(branch["rest"])
        assert node, f"not 'Name [(also X)] [[module]]  — why': {line!r}"
        assert depth <= len(stack), f"skips a level: {line!r}"
        del stack[depth:]
        also = tuple(node["also"].split(", ")) if node["also"] else ()
        module = node["module"] or "sendonce.errors"
        drawn.append(Drawn(node["name"], stack[-1] if stack else None, also, module))
        stack.append(node["name"])
    return drawn


def real_classes() -> list[type[SendOnceError]]:
    """Every public SendOnceError subclass defined anywhere in the package."""
    for info in pkgutil.walk_packages(sendonce.__path__, "sendonce."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: list[type[SendOnceError]] = []
    pending: list[type[SendOnceError]] = [SendOnceError]
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("sendonce") and cls not in found:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return [cls for cls in found if not cls.__name__.startswith("_")]


def parent_and_others(cls: type) -> tuple[str | None, tuple[str, ...]]:
    if cls is SendOnceError:
        return None, ()
    inside = [b for b in cls.__bases__ if issubclass(b, SendOnceError)]
    assert len(inside) == 1, f"{cls.__name__} has {len(inside)} parents in the tree"
    return inside[0].__name__, tuple(b.__name__ for b in cls.__bases__ if b is not inside[0])


def test_the_docstring_draws_every_error_class_under_its_real_parent() -> None:
    drawn = {d.name: d for d in parse(tree_lines(sendonce.errors.__doc__ or ""))}
    real = {cls.__name__: cls for cls in real_classes()}
    assert sorted(drawn) == sorted(real), "draw every SendOnceError subclass in errors.py"
    for name, cls in real.items():
        parent, others = parent_and_others(cls)
        assert (drawn[name].parent, drawn[name].also) == (parent, others), name
        module = importlib.import_module(drawn[name].module)
        assert getattr(module, name, None) is cls, f"{name} is not importable from [{module}]"


def test_each_class_is_drawn_once() -> None:
    names = [d.name for d in parse(tree_lines(sendonce.errors.__doc__ or ""))]
    assert len(names) == len(set(names))


def test_docs_index_shows_the_same_tree() -> None:
    docstring = tree_lines(sendonce.errors.__doc__ or "")
    assert tree_lines(INDEX.read_text(encoding="utf-8")) == docstring


def test_every_error_in_sendonce_errors_is_importable_from_sendonce() -> None:
    # Importable from the top, not all in its short __all__ (which lists what a producer catches).
    for name in sendonce.errors.__all__:
        value = getattr(sendonce.errors, name)
        if isinstance(value, type) and issubclass(value, SendOnceError):
            assert getattr(sendonce, name) is value, name


def test_the_parser_reads_what_it_should() -> None:
    lines = [
        "SendOnceError                 — base",
        "├── ValidationError (also ValueError) — bad",
        "│   └── MessageIdError        — id",
        "└── Other [sendonce.spark]    — other",
    ]
    assert parse(lines) == [
        Drawn("SendOnceError", None, (), "sendonce.errors"),
        Drawn("ValidationError", "SendOnceError", ("ValueError",), "sendonce.errors"),
        Drawn("MessageIdError", "ValidationError", (), "sendonce.errors"),
        Drawn("Other", "SendOnceError", (), "sendonce.spark"),
    ]
