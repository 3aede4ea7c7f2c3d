"""Property tests for MessageIdTemplate: injectivity, determinism, length bound, readability."""

from __future__ import annotations

import os
import pickle
import shutil
import string
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sendonce._ids as sendonce_ids
from property_budget import examples
from sendonce import MessageIdError, MessageIdTemplate
from sendonce._ids import canonical_text

SEPARATOR_START = [c for c in string.punctuation if c not in "%-_"]
READABLE = string.ascii_letters + string.digits + "-_"


@dataclass(frozen=True)
class Shape:
    """A template drawn at random: head, fields, and the literal after each field."""

    head: str
    fields: tuple[str, ...]
    literals: tuple[str, ...]  # literals[i] follows fields[i]; the last one is the tail

    @property
    def text(self) -> str:
        def lit(s: str) -> str:
            return s.replace("{", "{{").replace("}", "}}")

        out = lit(self.head)
        for name, after in zip(self.fields, self.literals, strict=True):
            out += "{" + name + "}" + lit(after)
        return out

    def naive(self, values: tuple[str, ...]) -> str:
        """The id an f-string without escaping would build."""
        out = self.head
        for v, after in zip(values, self.literals, strict=True):
            out += v + after
        return out


literal_chars = st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00")


@st.composite
def shapes(draw: st.DrawFn, *, max_fields: int = 4) -> Shape:
    n = draw(st.integers(1, max_fields))
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True),
            min_size=n,
            max_size=n,
            unique=True,
        )
    )
    head = draw(st.text(literal_chars, max_size=3))
    seps = [
        draw(st.sampled_from(SEPARATOR_START)) + draw(st.text(literal_chars, max_size=3))
        for _ in range(n - 1)
    ]
    tail = draw(st.text(literal_chars, max_size=3))
    return Shape(head, tuple(names), (*seps, tail))


def adversarial_values(shape: Shape) -> st.SearchStrategy[str]:
    """Strings made of the template's own literals, their first chars, %, escapes, unicode."""
    pieces = [p for p in (shape.head, *shape.literals) if p]
    fragments = st.sampled_from(
        [
            *pieces,
            *(p[0] for p in pieces),
            "%",
            "%25",
            "%2E",
            "%3A",
            "",
            "é",
            "😀",
            "a",
            "1",
        ]
    )
    glued = st.lists(st.one_of(fragments, st.text(literal_chars, max_size=3)), max_size=6).map(
        "".join
    )
    return st.one_of(
        glued,
        st.text(literal_chars, max_size=8),
        st.text(literal_chars, min_size=100, max_size=160),
    )


def splits(full: str, shape: Shape, limit: int = 64) -> list[tuple[str, ...]]:
    """Every tuple of values whose naive (unescaped) id equals ``full``."""
    if not full.startswith(shape.head) or not full.endswith(shape.literals[-1]):
        return []
    body = full[len(shape.head) : len(full) - len(shape.literals[-1])]
    if len(full) < len(shape.head) + len(shape.literals[-1]):
        return []
    seps = shape.literals[:-1]
    found: list[tuple[str, ...]] = []

    def walk(rest: str, i: int, acc: tuple[str, ...]) -> None:
        if len(found) >= limit:
            return
        if i == len(seps):
            found.append((*acc, rest))
            return
        sep = seps[i]
        start = rest.find(sep)
        while start != -1 and len(found) < limit:
            walk(rest[start + len(sep) :], i + 1, (*acc, rest[:start]))
            start = rest.find(sep, start + 1)

    walk(body, 0, ())
    return found


# ---------------------------------------------------------------- injectivity


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=shapes())
def test_injective_on_adversarial_values(data: st.DataObject, shape: Shape) -> None:
    t = MessageIdTemplate(shape.text, allow_empty=True, overflow="error", max_length=128)
    assert t.fields == shape.fields
    values = adversarial_values(shape)
    r1 = tuple(data.draw(values) for _ in shape.fields)
    r2 = tuple(data.draw(values) for _ in shape.fields)
    try:
        id1 = t.build(dict(zip(shape.fields, r1, strict=True)))
        id2 = t.build(dict(zip(shape.fields, r2, strict=True)))
    except MessageIdError:
        assume(False)
        return
    if id1 == id2:
        assert r1 == r2
    # Every other way of cutting r1's naive id into fields must give another id:
    # this is exactly where an f-string without escaping collides.
    for other in splits(shape.naive(r1), shape):
        if other == r1:
            continue
        try:
            other_id = t.build(dict(zip(shape.fields, other, strict=True)))
        except MessageIdError:
            continue
        assert other_id != id1, (shape.text, r1, other)


@settings(max_examples=examples(300))
@given(data=st.data(), shape=shapes(max_fields=3))
def test_injective_over_canonical_texts_of_mixed_types(data: st.DataObject, shape: Shape) -> None:
    t = MessageIdTemplate(shape.text, allow_empty=True, overflow="error")
    r1 = {f: data.draw(id_values) for f in shape.fields}
    r2 = {f: data.draw(id_values) for f in shape.fields}
    try:
        id1, id2 = t.build(r1), t.build(r2)
    except MessageIdError:
        assume(False)
        return
    if id1 == id2:
        for f in shape.fields:
            assert canonical_text(r1[f], f) == canonical_text(r2[f], f)
    else:
        assert any(canonical_text(r1[f], f) != canonical_text(r2[f], f) for f in shape.fields)


def test_splits_finds_the_naive_collision() -> None:
    """The oracle itself: it must find the ambiguity escaping prevents."""
    shape = Shape("", ("a", "b"), (".", ""))
    assert set(splits("1.2.3", shape)) == {("1", "2.3"), ("1.2", "3")}


# ---------------------------------------------------------------- readability


@settings(max_examples=examples(300))
@given(data=st.data(), shape=shapes())
def test_readable_values_appear_unchanged(data: st.DataObject, shape: Shape) -> None:
    t = MessageIdTemplate(shape.text, allow_empty=True)
    values = tuple(data.draw(st.text(READABLE, max_size=12)) for _ in shape.fields)
    naive = shape.naive(values)
    assume(naive and len(naive) <= 128)
    assert t.build(dict(zip(shape.fields, values, strict=True))) == naive


# ---------------------------------------------------------------- length bound


@settings(max_examples=examples(300))
@given(
    data=st.data(),
    shape=shapes(),
    max_length=st.integers(34, 128),
)
def test_every_id_within_max_length(data: st.DataObject, shape: Shape, max_length: int) -> None:
    hashing = MessageIdTemplate(
        shape.text, allow_empty=True, max_length=max_length, overflow="hash"
    )
    strict = MessageIdTemplate(
        shape.text, allow_empty=True, max_length=max_length, overflow="error"
    )
    values = adversarial_values(shape)
    record = {f: data.draw(values) for f in shape.fields}
    assume(shape.naive(tuple(record.values())))  # an empty id is refused, tested elsewhere
    try:
        full = MessageIdTemplate(shape.text, allow_empty=True, max_length=128).build(record)
    except MessageIdError:
        full = None  # over 128: only the hashing template may build it
    hashed = hashing.build(record)
    assert 0 < len(hashed) <= max_length
    if full is not None and len(full) <= max_length:
        assert strict.build(record) == full
        if len(full) < max_length:
            assert hashed == full
        # len == max_length: passed through or hashed (B3); either way exactly max_length
    else:
        assert len(hashed) == max_length
        with pytest.raises(MessageIdError) as ei:
            strict.build(record)
        assert ei.value.field == "message_id"


@settings(max_examples=examples(50))
@given(
    shape=shapes(max_fields=2),
    max_length=st.integers(34, 64),
    bulk=st.lists(
        st.text(literal_chars, min_size=40, max_size=90), min_size=20, max_size=60, unique=True
    ),
)
def test_hashed_ids_of_distinct_records_are_distinct(
    shape: Shape, max_length: int, bulk: list[str]
) -> None:
    t = MessageIdTemplate(shape.text, allow_empty=True, max_length=max_length, overflow="hash")
    records = [{f: f"{v}|{i}" for i, f in enumerate(shape.fields)} for v in bulk]
    ids = [t.build(r) for r in records]
    assert len(set(ids)) == len(records)
    assert all(len(i) <= max_length for i in ids)


def test_hashed_ids_distinct_on_a_large_shared_prefix_population() -> None:
    t = MessageIdTemplate("{customer}.{order}/payment", max_length=48, overflow="hash")
    prefix = "customer-with-a-very-long-name-" * 3
    ids = {t.build({"customer": prefix, "order": n}) for n in range(20_000)}
    assert len(ids) == 20_000
    assert {len(i) for i in ids} == {48}


# ---------------------------------------------------------------- canonical equivalence


@given(st.integers(-(10**40), 10**40))
def test_int_and_its_text_share_an_id(n: int) -> None:
    t = MessageIdTemplate("{a}/{b}")
    assert t.build({"a": n, "b": 1}) == t.build({"a": str(n), "b": "1"})


@given(
    st.decimals(
        allow_nan=False, allow_infinity=False, places=6, min_value=-(10**9), max_value=10**9
    ),
    st.integers(0, 5),
)
def test_trailing_zeros_do_not_change_decimal_ids(d: Decimal, zeros: int) -> None:
    padded = Decimal(f"{d:f}" + ("0" * zeros if "." in f"{d:f}" else "." + "0" * zeros))
    assert padded == d
    t = MessageIdTemplate("{a}")
    assert t.build({"a": padded}) == t.build({"a": d})


@given(
    st.datetimes(
        min_value=datetime(1900, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    st.integers(-14 * 60, 14 * 60),
)
def test_same_instant_in_any_offset_shares_an_id(moment: datetime, minutes: int) -> None:
    shifted = moment.astimezone(timezone(timedelta(minutes=minutes)))
    t = MessageIdTemplate("{at}/x")
    assert t.build({"at": shifted}) == t.build({"at": moment})


# ---------------------------------------------------------------- determinism

id_values = st.one_of(
    st.text(literal_chars, max_size=20),
    st.integers(-(10**20), 10**20),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=4, max_value=10**12, min_value=-(10**12)
    ),
    st.uuids(),
    st.dates(),
    st.datetimes(  # years 1 and 9999 with offsets: B10, tested on its own
        min_value=datetime(1900, 1, 2),
        max_value=datetime(2200, 1, 1),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]),
    ),
)

_CHILD = """
import pickle, sys
from sendonce import MessageIdTemplate
jobs = pickle.load(sys.stdin.buffer)
out = [
    MessageIdTemplate(t, max_length=m, overflow=o, allow_empty=True).build(r)
    for t, m, o, r in jobs
]
pickle.dump(out, sys.stdout.buffer)
"""


def _ids_in_subprocess(jobs: list[tuple[str, int, str, dict[str, Any]]], seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=pickle.dumps(jobs),
        capture_output=True,
        env=env,
        check=True,
        timeout=120,
    )
    result: list[str] = pickle.loads(proc.stdout)
    return result


@settings(max_examples=4, deadline=None)
@given(
    shape=shapes(max_fields=3),
    option=st.sampled_from([(128, "error"), (40, "hash")]),
    pool=st.lists(id_values, min_size=60, max_size=60),
)
def test_deterministic_across_processes_and_hash_seeds(
    shape: Shape, option: tuple[int, str], pool: list[Any]
) -> None:
    max_length, overflow = option
    t = MessageIdTemplate(shape.text, allow_empty=True, max_length=max_length, overflow=overflow)  # type: ignore[arg-type]
    n = len(shape.fields)
    jobs: list[tuple[str, int, str, dict[str, Any]]] = []
    here: list[str] = []
    for i in range(0, len(pool) - n + 1, n):
        record = dict(zip(shape.fields, pool[i : i + n], strict=True))
        try:
            here.append(t.build(record))
        except MessageIdError:
            continue
        jobs.append((shape.text, max_length, overflow, record))
    assume(jobs)
    assert _ids_in_subprocess(jobs, "1") == here
    assert _ids_in_subprocess(jobs, "4242") == here


_OTHER_PYTHON_CHILD = """
import importlib.util, pickle, sys
src = sys.argv[1]
# Load sendonce._ids without the package __init__ (other interpreters lack the dependencies).
spec = importlib.util.spec_from_file_location(
    "sendonce", src + "/sendonce/__init__.py", submodule_search_locations=[src + "/sendonce"]
)
sys.modules["sendonce"] = importlib.util.module_from_spec(spec)
from sendonce._ids import MessageIdTemplate
jobs = pickle.load(sys.stdin.buffer)
out = [
    MessageIdTemplate(t, max_length=m, overflow=o, allow_empty=True).build(r)
    for t, m, o, r in jobs
]
pickle.dump(out, sys.stdout.buffer, protocol=4)
"""


def _other_pythons() -> list[str]:
    """Other CPython 3.11+ interpreters: on PATH, or installed by pyenv."""
    candidates = [f"python3.{minor}" for minor in range(11, 16)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        candidates += sorted(str(p) for p in pyenv.glob("3.*/bin/python3"))
    found: dict[str, str] = {}
    for name in candidates:
        exe = shutil.which(name)
        if exe is None:
            continue
        probe = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        version = probe.stdout.strip()
        if probe.returncode != 0 or not version.startswith("3."):
            continue
        if (
            int(version.split(".")[1]) < 11
            or version == f"{sys.version_info[0]}.{sys.version_info[1]}"
        ):
            continue
        found.setdefault(version, exe)
    return sorted(found.values())


def test_deterministic_across_python_versions() -> None:
    """The same records give the same ids under every other Python found on this machine."""
    pythons = _other_pythons()
    if not pythons:
        pytest.skip("no other Python 3.11+ interpreter on PATH")
    base = datetime(2017, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    records = [
        {"a": 12345, "b": "x.y%z/é😀", "c": Decimal("10.50")},
        {"a": -(10**30), "b": "", "c": Decimal("1E+5")},
        {"a": uuid.UUID(int=7), "b": date(2017, 5, 1), "c": base},
        {"a": "q" * 80, "b": "/" * 50, "c": Decimal("-0.000100")},
    ]
    jobs: list[tuple[str, int, str, dict[str, Any]]] = [
        (t, m, o, r)
        for t in ("{a}.{b}/{c}", "k:{a}|{b}→{c}!")
        for m, o in ((128, "error"), (48, "hash"))
        for r in records
    ]
    here: list[Any] = []
    for t, m, o, r in jobs:
        try:
            here.append(MessageIdTemplate(t, max_length=m, overflow=o, allow_empty=True).build(r))  # type: ignore[arg-type]
        except MessageIdError:
            here.append(None)
    kept = [j for j, h in zip(jobs, here, strict=True) if h is not None]
    expected = [h for h in here if h is not None]
    assert len(kept) >= 12
    src = str(Path(sendonce_ids.__file__).resolve().parent.parent)
    for exe in pythons:
        proc = subprocess.run(
            [exe, "-c", _OTHER_PYTHON_CHILD, src],
            input=pickle.dumps(kept, protocol=4),
            capture_output=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": "random"},
        )
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        assert pickle.loads(proc.stdout) == expected, exe


def test_fixed_ids_never_change() -> None:
    """Golden values: a change here changes every id already in a broker's window."""
    t = MessageIdTemplate("{order}.{at}/{amount}:{ref}", max_length=128)
    record = {
        "order": 12345,
        "at": datetime(2017, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
        "amount": Decimal("10.50"),
        "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    }
    assert t.build(record) == (
        "12345.2017-05-01T12:00:00Z/10.5:12345678-1234-5678-1234-567812345678"
    )
    assert MessageIdTemplate("{s}.{d}").build({"d": date(2017, 5, 1), "s": "a.b%"}) == (
        "a%2Eb%25.2017-05-01"
    )
    hashed = MessageIdTemplate("{a}", max_length=40, overflow="hash").build({"a": "q" * 50})
    assert hashed == "qqqqqqq~" + "9655b12378286d80747a025ad68cbf82"


@given(st.data(), shapes())
def test_rebuilt_and_unpickled_templates_agree(data: st.DataObject, shape: Shape) -> None:
    t = MessageIdTemplate(shape.text, allow_empty=True, overflow="hash")
    copy = pickle.loads(pickle.dumps(t))
    record = {f: data.draw(id_values) for f in shape.fields}
    try:
        expected = t.build(record)
    except MessageIdError:
        return
    assert (
        copy.build(record)
        == expected
        == MessageIdTemplate(shape.text, allow_empty=True, overflow="hash").build(record)
    )
