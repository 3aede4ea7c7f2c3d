"""The keys a ``sendonce ledger confirm`` or ``release`` resolves: from ``--id``, a file or stdin.

``--from-format`` says how ``--from`` is read; ``--json`` only chooses the output.
``text``: one message id per line, optionally a tab and its partition key; blank lines are
skipped. ``json``: what ``in-doubt --json`` prints (an object whose ``keys`` lists them), a
JSON array (such as a list ``reconcile --json`` prints), or JSON Lines; each key is a
message id or an object with ``message_id`` and ``partition_key``. ``auto`` (the default)
reads JSON when the first non-blank character is ``{``, ``[`` or ``"`` (a text line
starting so is refused in ``auto``: it looks like JSON), text otherwise. A line that is
not a key is refused with its line number: nothing is resolved then.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..ledger import Key
from ._words import InputError

__all__ = ["FROM_FORMATS", "read_keys"]

FROM_FORMATS = ("auto", "text", "json")

_MAX_SHOWN = 20


def read_keys(
    ids: tuple[str, ...], source: str | None, partition_key: str, *, from_format: str = "auto"
) -> list[Key]:
    """Every key named by ``--id`` and ``--from``, in order, each once."""
    if not ids and source is None:
        raise click.UsageError("give the keys: --id ID (repeat it), or --from FILE (- for stdin)")
    keys = [_key(mid, partition_key, "--id") for mid in ids]
    if source is not None:
        text = _read(source)
        if from_format == "auto":
            from_format = "json" if text.lstrip().startswith(_JSON_STARTS) else "text"
            strict = True
        else:
            strict = False
        if from_format == "json":
            keys += _json_keys(text, partition_key)
        else:
            keys += _text_keys(text, partition_key, strict=strict)
    return list(dict.fromkeys(keys))


_JSON_STARTS = ("{", "[", '"')


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        with open(source, encoding="utf-8") as stream:
            return stream.read()
    except OSError as exc:
        raise InputError(f"--from: cannot read {source!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"--from: {source!r} is not UTF-8 text ({exc.reason})") from None


def _key(message_id: object, partition_key: object, where: str) -> Key:
    if not isinstance(message_id, str) or not message_id.strip():
        raise InputError(f"{where}: a message id must be a non-empty text, not {message_id!r}")
    if partition_key is not None and not isinstance(partition_key, str):
        raise InputError(f"{where}: a partition key must be a text, not {partition_key!r}")
    return Key(message_id, partition_key or None)


def _text_keys(text: str, partition_key: str, *, strict: bool) -> list[Key]:
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        mid, tab, pk = line.partition("\t")
        if strict and mid.lstrip().startswith(_JSON_STARTS) and not tab:
            raise InputError(
                f"--from line {number}: {line[:60]!r} looks like JSON in a file of message ids: "
                "give --from-format json to read it as JSON (what in-doubt --json prints), or "
                "--from-format text to take each line as a message id"
            )
        keys.append(_key(mid, pk if tab else partition_key, f"--from line {number}"))
    return keys


def _json_keys(text: str, partition_key: str) -> list[Key]:
    stripped = text.strip()
    if not stripped:
        return []
    try:
        document: Any = json.loads(stripped)
        if isinstance(document, str):
            document = [document]  # JSON Lines of one id
        items = document.get("keys") if isinstance(document, dict) else document
        if not isinstance(items, list):
            raise InputError(
                '--from: a JSON object must list its keys under "keys" (as in-doubt --json '
                "prints them)"
            )
        return [
            _json_key(item, partition_key, f"--from key {i}") for i, item in enumerate(items, 1)
        ]
    except json.JSONDecodeError:
        pass
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"--from line {number}: malformed JSON: {exc.msg}") from None
        keys.append(_json_key(item, partition_key, f"--from line {number}"))
    return keys


def _json_key(item: Any, partition_key: str, where: str) -> Key:
    if isinstance(item, str):
        return _key(item, partition_key, where)
    if isinstance(item, dict) and "message_id" in item:
        return _key(item["message_id"], item.get("partition_key", partition_key), where)
    raise InputError(
        f"{where}: a key is a message id or an object with message_id (and partition_key), "
        f"not {json.dumps(item)[:60]}"
    )
