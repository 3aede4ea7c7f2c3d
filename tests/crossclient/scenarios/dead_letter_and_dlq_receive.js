// deadLetterMessage moves a message to the dead-letter subqueue with the reason and
// description given; the subqueue is peeked and received like a queue, and the message keeps
// its properties.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sent = {
    body: Buffer.from("bad order"),
    messageId: t.id("bad"),
    subject: "order",
    applicationProperties: { tenant: "acme" },
  };
  await t.sender("deadletter").sendMessages([sent, { body: "good", messageId: t.id("good") }]);
  const receiver = t.receiver("deadletter");
  const [bad, good] = await t.receiveAll(receiver, 2);
  await receiver.deadLetterMessage(bad, {
    deadLetterReason: "Validation",
    deadLetterErrorDescription: "amount is negative",
  });
  await receiver.completeMessage(good);
  await t.expectEmpty(receiver);
  assert.deepEqual(await t.peekFromStart("deadletter"), [], "the main queue is empty");

  const deadLetters = t.receiver("deadletter", { subQueueType: "deadLetter" });
  assert.equal(deadLetters.entityPath, "deadletter/$DeadLetterQueue");
  const peeked = await deadLetters.peekMessages(5);
  assert.deepEqual(
    peeked.map((m) => m.messageId),
    [t.id("bad")],
  );

  const [dead] = await t.receiveAll(deadLetters, 1);
  assert.equal(dead.deadLetterReason, "Validation");
  assert.equal(dead.deadLetterErrorDescription, "amount is negative");
  assert.deepEqual(dead.body, sent.body);
  assert.equal(dead.subject, "order");
  assert.equal(dead.applicationProperties.tenant, "acme");
  assert.equal(
    dead.sequenceNumber.toNumber(),
    bad.sequenceNumber.toNumber(),
    "same sequence number",
  );
  await deadLetters.completeMessage(dead);
  await t.expectEmpty(deadLetters);
};
