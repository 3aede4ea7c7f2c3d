// A message past its time to live is not received; on an entity with dead-lettering on
// expiration it moves to the dead-letter subqueue (reason TTLExpiredException) once a receiver
// pulls from the entity.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("expiring").sendMessages([
    { body: "short", messageId: t.id("short"), timeToLive: 1000 },
    { body: "long", messageId: t.id("long"), timeToLive: 60_000 },
  ]);
  await t.sleep(1500);
  const receiver = t.receiver("expiring");
  const [first] = await t.receiveAll(receiver, 1);
  assert.equal(first.messageId, t.id("long"), "the expired one is skipped");
  await receiver.completeMessage(first);
  await t.expectEmpty(receiver);

  const deadLetters = t.receiver("expiring", { subQueueType: "deadLetter" });
  const [dead] = await t.receiveAll(deadLetters, 1);
  assert.equal(dead.messageId, t.id("short"));
  assert.equal(dead.deadLetterReason, "TTLExpiredException");
  await deadLetters.completeMessage(dead);
};
