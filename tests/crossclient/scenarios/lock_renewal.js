// renewMessageLock extends a message lock past the entity's lock duration, so the message can
// still be completed; the client's automatic renewal does the same.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const lockMs = t.lockDurationMs;
  await t.sender("renewal").sendMessages([
    { body: "manual", messageId: t.id("manual") },
    { body: "auto", messageId: t.id("auto") },
  ]);

  const manual = t.receiver("renewal", { maxAutoLockRenewalDurationInMs: 0 });
  const before = Date.now();
  const [message] = await t.receiveAll(manual, 1);
  t.assertLockedFor(message.lockedUntilUtc, before, Date.now(), "received");
  assert.equal(message.messageId, t.id("manual"));
  const firstLock = message.lockedUntilUtc.getTime();
  // Renew every 30% of the lock duration until well past the first lock's expiry.
  let renewals = 0;
  while (Date.now() < firstLock + lockMs * 0.3) {
    await t.sleep(lockMs * 0.3);
    const asked = Date.now();
    const renewed = await manual.renewMessageLock(message);
    t.assertLockedFor(renewed, asked, Date.now(), "renewMessageLock");
    assert.equal(message.lockedUntilUtc.getTime(), renewed.getTime(), "the message shows it");
    renewals += 1;
  }
  assert.ok(renewals >= 3, "renewed several times");
  await manual.completeMessage(message);

  const auto = t.receiver("renewal"); // maxAutoLockRenewalDurationInMs: 5 minutes by default
  const [held] = await t.receiveAll(auto, 1);
  assert.equal(held.messageId, t.id("auto"));
  await t.sleep(lockMs * 1.4); // past the first lock's expiry
  await auto.completeMessage(held);
  assert.deepEqual(await t.peekFromStart("renewal"), [], "both completed");
};
