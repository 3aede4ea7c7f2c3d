// A subscription has its own dead-letter subqueue (<topic>/Subscriptions/<name>/$DeadLetterQueue):
// dead-lettering in one subscription leaves the other subscription's copy alone.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("subdlq").sendMessages({ body: "x", messageId: t.id("x") });
  const first = t.receiver("subdlq", "first");
  const [message] = await t.receiveAll(first, 1);
  await first.deadLetterMessage(message, { deadLetterReason: "NotForUs" });

  const deadLetters = t.receiver("subdlq", "first", { subQueueType: "deadLetter" });
  assert.equal(deadLetters.entityPath, "subdlq/Subscriptions/first/$DeadLetterQueue");
  const [dead] = await t.receiveAll(deadLetters, 1);
  assert.equal(dead.messageId, t.id("x"));
  assert.equal(dead.deadLetterReason, "NotForUs");
  await deadLetters.completeMessage(dead);

  const second = t.receiver("subdlq", "second");
  const [copy] = await t.receiveAll(second, 1);
  assert.equal(copy.messageId, t.id("x"), "the other subscription's copy is untouched");
  await second.completeMessage(copy);
  const otherDeadLetters = t.receiver("subdlq", "second", { subQueueType: "deadLetter" });
  assert.deepEqual(await otherDeadLetters.peekMessages(5), []);
};
