// A message abandoned max-delivery-count times moves to the dead-letter subqueue with reason
// MaxDeliveryCountExceeded (the queue's max_delivery_count is 3).
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("maxdelivery").sendMessages({ body: "poison", messageId: t.id("poison") });
  const receiver = t.receiver("maxdelivery");
  const counts = [];
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const [message] = await t.receiveAll(receiver, 1);
    assert.ok(message, `delivery ${attempt + 1} arrived`);
    counts.push(message.deliveryCount);
    await receiver.abandonMessage(message);
  }
  assert.deepEqual(counts, [0, 1, 2], "raw header delivery counts of the three deliveries");
  await t.expectEmpty(receiver);

  const deadLetters = t.receiver("maxdelivery", { subQueueType: "deadLetter" });
  const [dead] = await t.receiveAll(deadLetters, 1);
  assert.equal(dead.messageId, t.id("poison"));
  assert.equal(dead.deadLetterReason, "MaxDeliveryCountExceeded");
  assert.equal(typeof dead.deadLetterErrorDescription, "string");
  await deadLetters.completeMessage(dead);
  await t.expectEmpty(deadLetters);
};
