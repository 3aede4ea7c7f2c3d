"""How fast are ids and messages built? One core, figures and ratios from one run.

    python bench/bench_ids.py [--n 200000] [--repeat 5]

Prints ids per second for ``MessageIdTemplate.build`` (2 and 4 fields) next to a
hand-written f-string with no escaping and no type checks (the baseline a
producer would otherwise write), ``MessageSpec.to_message`` per second, and
``content_message_id`` per second. Rates are CPU time of this process (best of
``--repeat``), so other processes on a shared machine disturb them less.

``build`` runs straight-line code generated per template, falling back to the
generic builder for every error and overflow; the generic builder is timed beside it,
after a check that both return exactly the same ids and errors (empty values, escapes,
overflow, typed values), so the figure of each is for the same results.

``--smoke``: every step on a few hundred records, once (a test keeps the script running).
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from _smoke import add_smoke, apply_smoke

from sendonce import MessageIdError, MessageIdTemplate, MessageSpec, content_message_id


def best_rate(fn: Callable[[], object], n: int, repeat: int) -> float:
    """Operations per CPU second of ``fn`` (which does ``n`` operations), best of ``repeat``."""
    best = float("inf")
    gc.collect()
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return n / max(best, 1e-9)


def same_result(a: Callable[[Any], str], b: Callable[[Any], str], record: Any) -> bool:
    def run(f: Callable[[Any], str]) -> object:
        try:
            return f(record)
        except MessageIdError as exc:
            return ("error", exc.field, str(exc))

    return run(a) == run(b)


def records_2(n: int) -> list[dict[str, Any]]:
    return [{"order_id": 10_000_000 + i, "year": 2017 + i % 5} for i in range(n)]


def records_4(n: int) -> list[dict[str, Any]]:
    return [
        {
            "tenant": f"tenant-{i % 97}",
            "order_id": 10_000_000 + i,
            "line": i % 13,
            "kind": "payment",
        }
        for i in range(n)
    ]


def records_typed(n: int) -> list[dict[str, Any]]:
    base = datetime(2017, 5, 1, tzinfo=UTC)
    return [
        {
            "order_id": 10_000_000 + i,
            "at": base + timedelta(seconds=i),
            "amount": Decimal(i) / 100,
            "ref": uuid.UUID(int=i),
        }
        for i in range(n)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(argv), n=400, repeat=1)
    n, repeat = args.n, args.repeat

    r2, r4, rt = records_2(n), records_4(n), records_typed(n // 4)
    t2 = MessageIdTemplate("{order_id}.{year}/payment")
    t4 = MessageIdTemplate("{tenant}/{order_id}.{line}:{kind}")
    tt = MessageIdTemplate("{order_id}.{at}/{amount}:{ref}")
    spec = MessageSpec("{order_id}.{year}/payment", partition_key="{order_id}")
    bodies = [f'{{"order_id":{10_000_000 + i},"amount":"12.50"}}'.encode() for i in range(n // 4)]

    # correctness first: the template agrees with the baseline on readable values
    assert all(t2.build(r) == f"{r['order_id']}.{r['year']}/payment" for r in r2[:1000])
    assert all(
        t4.build(r) == f"{r['tenant']}/{r['order_id']}.{r['line']}:{r['kind']}" for r in r4[:1000]
    )

    odd: list[dict[str, Any]] = [
        {"order_id": "1.2%", "year": "%/", "tenant": "a/b", "line": "1:2.3", "kind": "%:"},
        {"order_id": "", "year": "", "tenant": "", "line": "", "kind": ""},
        {"order_id": None, "year": 1.5, "tenant": True, "line": b"x", "kind": "k"},
        {"order_id": "9" * 200, "year": 1, "tenant": "t" * 200, "line": 1, "kind": "k"},
        {"order_id": 10**5000, "year": 1, "tenant": "t", "line": 1, "kind": "k"},
        {"year": 1},
    ]
    # the generated code and the generic builder it falls back to agree on every record
    generic2, generic4, generict = t2._build_checked, t4._build_checked, tt._build_checked
    for t, generic, recs in ((t2, generic2, r2), (t4, generic4, r4), (tt, generict, rt)):
        assert all(same_result(t.build, generic, r) for r in [*recs[:2000], *odd])

    build2 = t2.build
    build4 = t4.build
    buildt = tt.build
    to_message = spec.to_message

    rows: list[tuple[str, float, float | None]] = []

    def bench(name: str, fn: Callable[[], object], ops: int, base: float | None = None) -> float:
        rate = best_rate(fn, ops, repeat)
        rows.append((name, rate, base))
        return rate

    f2 = bench(
        "f-string, 2 fields (baseline)",
        lambda: [f"{r['order_id']}.{r['year']}/payment" for r in r2],
        n,
    )
    bench("MessageIdTemplate.build, 2 fields", lambda: [build2(r) for r in r2], n, f2)
    bench("  generic builder, 2 fields", lambda: [generic2(r) for r in r2], n, f2)
    f4 = bench(
        "f-string, 4 fields (baseline)",
        lambda: [f"{r['tenant']}/{r['order_id']}.{r['line']}:{r['kind']}" for r in r4],
        n,
    )
    bench("MessageIdTemplate.build, 4 fields", lambda: [build4(r) for r in r4], n, f4)
    bench("  generic builder, 4 fields", lambda: [generic4(r) for r in r4], n, f4)
    ft = bench(
        "f-string, int/datetime/Decimal/UUID (baseline)",
        lambda: [f"{r['order_id']}.{r['at'].isoformat()}/{r['amount']}:{r['ref']}" for r in rt],
        len(rt),
    )
    bench(
        "MessageIdTemplate.build, int/datetime/Decimal/UUID",
        lambda: [buildt(r) for r in rt],
        len(rt),
        ft,
    )
    bench("  generic builder, typed", lambda: [generict(r) for r in rt], len(rt), ft)
    bench(
        "MessageSpec.to_message (id + key + JSON body)",
        lambda: [to_message(r) for r in r2[: n // 4]],
        n // 4,
    )
    bench(
        "content_message_id (~40-byte bodies)",
        lambda: [content_message_id(b) for b in bodies],
        len(bodies),
    )

    print(
        f"python {platform.python_version()} on {platform.machine()}, n={n}, "
        f"best of {repeat}, CPU time of one process"
    )
    width = max(len(name) for name, _, _ in rows)
    for name, rate, base in rows:
        ratio = f"  {rate / base:5.2f}x baseline" if base else ""
        print(f"{name:<{width}}  {rate:>12,.0f} /s{ratio}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
