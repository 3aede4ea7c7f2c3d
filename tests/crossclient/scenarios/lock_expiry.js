// A message whose lock expires is delivered again with its delivery count grown, and settling
// it with the old lock fails with MessageLockLost.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("expiry").sendMessages({ body: "slow", messageId: t.id("slow") });

  const receiver = t.receiver("expiry", { maxAutoLockRenewalDurationInMs: 0 });
  const before = Date.now();
  const [first] = await t.receiveAll(receiver, 1);
  t.assertLockedFor(first.lockedUntilUtc, before, Date.now(), "received");
  await t.sleep(first.lockedUntilUtc.getTime() - Date.now() + 500);

  await t.expectServiceBusError(receiver.completeMessage(first), "MessageLockLost");
  await t.expectServiceBusError(receiver.renewMessageLock(first), "MessageLockLost");

  const [second] = await t.receiveAll(receiver, 1);
  assert.equal(second.messageId, t.id("slow"));
  assert.equal(second.deliveryCount, 1, "one expired delivery before this one");
  assert.notEqual(second.lockToken, first.lockToken);
  await receiver.completeMessage(second);
  await t.expectEmpty(receiver);
};
