"""``amqps://``: TLS to the broker's ``tls`` acceptor (a self-signed ``localhost``
certificate), trusted through ``ca_file``; an untrusted certificate is refused before
anything is sent."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from artemis.raw import drain
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.errors import ConfigurationError, SendError

FAST = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.05, attempt_timeout=10)


def tls_url(broker, *, ca: bool = True, scheme: str = "amqps") -> str:
    url = f"{scheme}://{broker.user}:{broker.password}@localhost:{broker.tls_port}"
    return url + (f"?ca_file={quote(str(broker.ca_file))}" if ca else "")


def test_amqps_with_the_brokers_ca_sends(artemis_broker, artemis_address):
    with IdempotentSender(
        tls_url(artemis_broker), EntityProfile(artemis_address, id_cache_size=100), retry=FAST
    ) as sender:
        assert sender.backend.tls  # type: ignore[attr-defined]
        sender.send(Message("over TLS", message_id="t-1"))
    assert [(m.id, m.body) for m in drain(artemis_broker.url(), artemis_address)] == [
        ("t-1", "over TLS")
    ]


def test_an_untrusted_certificate_is_refused_before_sending(artemis_broker, artemis_address):
    profile = EntityProfile(artemis_address, id_cache_size=100)
    with pytest.raises(ConfigurationError, match="certificate") as refused:
        IdempotentSender(tls_url(artemis_broker, ca=False), profile, retry=FAST)
    assert refused.value.field == "url"
    assert artemis_broker.password not in str(refused.value)
    assert drain(artemis_broker.url(), artemis_address) == []


def test_plain_amqp_to_a_tls_acceptor_fails_without_hanging(artemis_broker, artemis_address):
    profile = EntityProfile(artemis_address, id_cache_size=100)
    # The acceptor waits for a TLS handshake that never comes: each attempt times out.
    url = tls_url(artemis_broker, ca=False, scheme="amqp") + "?connect_timeout=1"
    quick = RetryPolicy(max_attempts=2, initial_backoff=0.01, attempt_timeout=1)
    with pytest.raises((ConfigurationError, SendError)):
        with IdempotentSender(url, profile, retry=quick) as sender:
            sender.send(Message("x", message_id="a"))
    assert drain(artemis_broker.url(), artemis_address) == []
