"""The standard AMQP conditions are classified once, and both AMQP backends read that map."""

from __future__ import annotations

import pytest

from sendonce.backends import _amqp_conditions as amqp


def test_no_condition_is_both_refused_and_transient() -> None:
    assert not amqp.REFUSED & amqp.TRANSIENT
    assert amqp.RESOURCE_LIMIT not in amqp.REFUSED | amqp.TRANSIENT


def test_service_bus_and_artemis_agree_on_every_standard_condition_but_the_resource_limit() -> None:
    pytest.importorskip("azure.servicebus")
    pytest.importorskip("proton")
    from sendonce.backends.artemis import _errors as artemis
    from sendonce.backends.servicebus import _errors as servicebus

    for condition in amqp.REFUSED:
        assert condition in servicebus.PERMANENT_CONDITIONS
        assert condition in artemis.PERMANENT_CONDITIONS
    for condition in amqp.TRANSIENT:
        assert condition in servicebus.TRANSIENT_CONDITIONS
        assert condition in artemis.TRANSIENT_CONDITIONS
    # A quota on Service Bus (refused until it changes), an address full on Artemis.
    assert amqp.RESOURCE_LIMIT in servicebus.PERMANENT_CONDITIONS
    assert amqp.RESOURCE_LIMIT in artemis.TRANSIENT_CONDITIONS
    for module in (servicebus, artemis):
        assert not module.PERMANENT_CONDITIONS & module.TRANSIENT_CONDITIONS
