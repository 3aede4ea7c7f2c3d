// Known divergence: scheduled messages on a topic. Service Bus keeps them on the topic until
// their time (peek shows scheduled messages for queues, not for subscriptions); the emulator
// copies them to the subscriptions when scheduled, so a subscription's peek shows them early.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/azure/service-bus-messaging/message-browsing";

module.exports.run = async (t) => {
  const at = new Date(Date.now() + 1500);
  await t.sender("schedfanout").scheduleMessages({ body: "later", messageId: t.id("later") }, at);
  const receiver = t.receiver("schedfanout", "early");

  const early = await receiver.peekMessages(5);
  t.stillDiverges(
    early.map((m) => m.messageId).includes(t.id("later")),
    "a subscription's peek shows a topic's scheduled message before its time",
  );
  const none = await receiver.receiveMessages(5, { maxWaitTimeInMs: 300 });
  assert.deepEqual(none, [], "but it is not received before its time");

  const [due] = await t.receiveAll(receiver, 1, 4000);
  assert.equal(due.messageId, t.id("later"), "it is received once due");
  await receiver.completeMessage(due);
};
