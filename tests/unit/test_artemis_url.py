"""``amqp://`` urls: each mistake is a ConfigurationError naming the url, its password never
shown, and nothing opened (no event-loop thread, no socket)."""

from __future__ import annotations

import threading

import pytest

from sendonce.backends import connect
from sendonce.errors import ConfigurationError

pytest.importorskip("proton")

SECRET = "s3cr3t-Passw0rd"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"amqp://user:{SECRET}@", "names no host"),
        (f"amqp://user:{SECRET}@broker:notaport", "Port could not be cast"),
        (f"amqp://user:{SECRET}@broker:99999", "Port out of range"),
        (f"amqp://user:{SECRET}@broker:5672/orders", "has a path"),
        (f"amqp://user:{SECRET}@broker:5672#x", "fragment"),
        (f"amqp://:{SECRET}@broker:5672", "a password but no user"),
        (f"amqp://user:{SECRET}@broker:5672?bogus=1", "unknown option 'bogus'"),
        (f"amqp://user:{SECRET}@broker?max_in_flight=1&max_in_flight=2", "given twice"),
        (f"amqp://user:{SECRET}@broker?max_in_flight=lots", "must be a number"),
        (f"amqp://user:{SECRET}@broker?max_in_flight=0", "max_in_flight must be an int"),
        (f"amqp://user:{SECRET}@broker?resend_reach=1.5", "resend_reach must be a fraction"),
        (f"amqp://user:{SECRET}@broker?heartbeat=-1", "heartbeat must be a positive"),
    ],
)
def test_a_bad_url_is_refused_naming_what_is_wrong(url: str, says: str) -> None:
    before = set(threading.enumerate())  # a thread another test left may end meanwhile
    with pytest.raises(ConfigurationError, match=says) as refused:
        connect(url)
    assert SECRET not in str(refused.value) and SECRET not in repr(refused.value)
    assert refused.value.field in ("url", "max_in_flight", "resend_reach", "heartbeat")
    assert set(threading.enumerate()) - before == set()  # no event loop was started


def test_a_good_url_gives_its_parts_and_percent_decodes_the_credentials() -> None:
    from sendonce.backends.artemis._url import parse_amqp_url

    assert parse_amqp_url("amqps://app%40corp:p%2Fss%40w@broker.example?max_in_flight=32") == {
        "host": "broker.example",
        "tls": True,
        "user": "app@corp",
        "password": "p/ss@w",
        "max_in_flight": 32,
    }
    assert parse_amqp_url("amqp://broker:5673/") == {"host": "broker", "tls": False, "port": 5673}
