"""A two-node Artemis cluster on 127.0.0.1 (a static cluster connection, DESIGN.md §6): each
node has its own id cache, so a resend that reaches the other node would store a second
copy. The producer connects through a proxy standing for a load balancer; its reconnection
after a lost disposition lands on the other node, and the sender reports the message in
doubt instead of resending it there. Slow (two brokers): under ``-m slow``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from artemis.broker import ArtemisBroker
from artemis.faultproxy import FaultProxy
from artemis.raw import browse_ids, message_count, wait_for
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.errors import InDoubtError

pytestmark = pytest.mark.slow

RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.05, max_backoff=0.5, attempt_timeout=20)
BRIDGED = "AMQ221027"  # "Bridge ClusterConnectionBridge ... is connected"


def _join(node: ArtemisBroker, other: ArtemisBroker) -> None:
    """Write a static cluster connection from ``node`` to ``other`` into its broker.xml."""
    path = node.instance / "etc" / "broker.xml"
    cluster = f"""
<connectors>
  <connector name="self">tcp://127.0.0.1:{node.port}</connector>
  <connector name="other">tcp://127.0.0.1:{other.port}</connector>
</connectors>
<cluster-user>cluster</cluster-user>
<cluster-password>cluster-test-secret</cluster-password>
<cluster-connections>
  <cluster-connection name="pair">
    <connector-ref>self</connector-ref>
    <message-load-balancing>ON_DEMAND</message-load-balancing>
    <max-hops>1</max-hops>
    <static-connectors><connector-ref>other</connector-ref></static-connectors>
  </cluster-connection>
</cluster-connections>
"""
    text = path.read_text()
    path.write_text(text.replace("<persistence-enabled>", cluster + "<persistence-enabled>", 1))


def test_a_resend_that_would_reach_the_other_cluster_node_is_in_doubt():
    with ArtemisBroker() as a, ArtemisBroker() as b:
        for node, other in ((a, b), (b, a)):
            node.stop()
            _join(node, other)
        a.start()
        b.start()
        wait_for(lambda: BRIDGED in a.log() and BRIDGED in b.log(), timeout=120, what="bridged")
        profile = EntityProfile("orders", id_cache_size=20_000)
        with FaultProxy("127.0.0.1", a.port) as balancer:
            url = a.url(port=balancer.port)
            with IdempotentSender(url, profile, retry=RETRY) as sender:
                sender.send(Message("first", message_id="order-1"))
                balancer.cut_after(b"lost answer", settle=None)
                with ThreadPoolExecutor(1) as pool:
                    running = pool.submit(sender.send, Message("lost answer", message_id="x"))
                    wait_for(lambda: message_count(a.url(), "orders") == 2, what="x on node a")
                    balancer.route_to("127.0.0.1", b.port)  # the reconnection goes to b
                    balancer.cut()
                    with pytest.raises(InDoubtError, match="node") as doubt:
                        running.result(timeout=120)
                assert doubt.value.message_id == "x"
                # New messages go on, to node b now.
                assert sender.send(Message("after", message_id="order-2")).outcome == "sent"
        time.sleep(0.5)
        on_a, on_b = browse_ids(a.url(), "orders"), browse_ids(b.url(), "orders")
    assert sorted(on_a + on_b) == ["order-1", "order-2", "x"]  # x once, on the node it reached
    assert "x" in on_a
