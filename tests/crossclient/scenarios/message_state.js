// The x-opt-message-state annotation. Service Bus marks deferred and scheduled messages (state
// "deferred" / "scheduled" in peek and in receiveDeferredMessages); a received message is active.
"use strict";

const assert = require("node:assert/strict");

// https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceivedmessage.state
module.exports.run = async (t) => {
  const sender = t.sender("states");
  await sender.sendMessages([
    { body: "defer me", messageId: t.id("deferred") },
    { body: "plain", messageId: t.id("active") },
  ]);
  await sender.scheduleMessages(
    { body: "later", messageId: t.id("scheduled") },
    new Date(Date.now() + 10 * 60_000),
  );
  const receiver = t.receiver("states");
  const [toDefer] = await t.receiveAll(receiver, 1);
  assert.equal(toDefer.messageId, t.id("deferred"));
  assert.equal(toDefer.state, "active", "a received message is active");
  await receiver.deferMessage(toDefer);

  const peeked = await receiver.peekMessages(10);
  const states = Object.fromEntries(peeked.map((m) => [m.messageId, m.state]));
  assert.deepEqual(Object.keys(states).sort(), [
    t.id("active"),
    t.id("deferred"),
    t.id("scheduled"),
  ]);
  assert.equal(states[t.id("active")], "active");
  assert.equal(states[t.id("deferred")], "deferred", "a peeked deferred message");
  assert.equal(states[t.id("scheduled")], "scheduled", "a peeked scheduled message");

  const [deferred] = await receiver.receiveDeferredMessages(toDefer.sequenceNumber);
  assert.equal(deferred.state, "deferred", "receiveDeferredMessages");
  await receiver.completeMessage(deferred);
};
