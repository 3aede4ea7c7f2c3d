// Known divergence: scheduled messages on a topic. Service Bus keeps them on the topic until
// their time (peek shows scheduled messages for queues, not for subscriptions); the emulator
// copies them to the subscriptions when scheduled, so a subscription's peek shows them early.
// Receiving waits for their time in both, and cancelling on the topic removes them.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/azure/service-bus-messaging/message-browsing";

module.exports.run = async (t) => {
  const sender = t.sender("schedfanout");
  const [farSeq] = await sender.scheduleMessages(
    { body: "far", messageId: t.id("far") },
    new Date(Date.now() + 10 * 60_000),
  );
  const near = new Date(Date.now() + 1500);
  await sender.scheduleMessages({ body: "near", messageId: t.id("near") }, near);
  const receiver = t.receiver("schedfanout", "early");

  const peeked = (await receiver.peekMessages(5)).map((m) => m.messageId);
  t.stillDiverges(
    peeked.includes(t.id("far")),
    "a subscription's peek shows a topic's scheduled message before its time",
  );
  const due = await t.receiveScheduled(receiver, 1, near);
  assert.deepEqual(
    due.map((m) => m.messageId),
    [t.id("near")],
    "received once due, not before",
  );
  await receiver.completeMessage(due[0]);

  await sender.cancelScheduledMessages(farSeq);
  assert.deepEqual(
    await t.peekFromStart("schedfanout", "early"),
    [],
    "cancelling on the topic removes it",
  );
};
