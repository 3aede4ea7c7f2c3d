// The transfer dead-letter subqueue (<queue>/$Transfer/$DeadLetterQueue). Service Bus has one
// for every queue and subscription, empty unless forwarding or send-via failed (neither of
// which the emulator does): receiving and peeking find nothing
// (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues).
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("transferdlq").sendMessages({ body: "x", messageId: t.id("x") });
  const receiver = t.receiver("transferdlq", { subQueueType: "transferDeadLetter" });
  assert.equal(receiver.entityPath, "transferdlq/$Transfer/$DeadLetterQueue");

  assert.deepEqual(await receiver.receiveMessages(1, { maxWaitTimeInMs: 1000 }), []);
  assert.deepEqual(await receiver.peekMessages(1), []);

  // The message itself stays where it was sent.
  const main = t.receiver("transferdlq", { receiveMode: "receiveAndDelete" });
  const [sent] = await t.receiveAll(main, 1);
  assert.equal(sent.messageId, t.id("x"));
};
