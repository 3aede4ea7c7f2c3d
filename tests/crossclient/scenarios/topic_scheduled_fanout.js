// Scheduled messages on a topic stay on the topic until their time (peek shows scheduled
// messages for queues, not for subscriptions: message browsing), and fan out at activation to
// the subscriptions that exist then. Cancelling on the topic removes a waiting one.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("schedfanout");
  const [farSeq] = await sender.scheduleMessages(
    { body: "far", messageId: t.id("far") },
    new Date(Date.now() + 10 * 60_000),
  );
  const near = new Date(Date.now() + 1500);
  await sender.scheduleMessages({ body: "near", messageId: t.id("near") }, near);
  const receiver = t.receiver("schedfanout", "early");

  assert.deepEqual(
    (await receiver.peekMessages(5)).map((m) => m.messageId),
    [],
    "a subscription's peek does not show its topic's scheduled messages",
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
