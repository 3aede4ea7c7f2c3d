// renewMessageLock extends a message lock past the entity's lock duration, so the message can
// still be completed; the client's automatic renewal does the same.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const lockMs = Number(process.env.CROSSCLIENT_LOCK_DURATION_MS || "5000");
  await t.sender("renewal").sendMessages([
    { body: "manual", messageId: t.id("manual") },
    { body: "auto", messageId: t.id("auto") },
  ]);

  const manual = t.receiver("renewal", { maxAutoLockRenewalDurationInMs: 0 });
  const [message] = await t.receiveAll(manual, 1);
  assert.equal(message.messageId, t.id("manual"));
  const firstLock = message.lockedUntilUtc.getTime();
  await t.sleep(lockMs * 0.6);
  const renewed = await manual.renewMessageLock(message);
  assert.ok(renewed.getTime() > firstLock, "the lock was extended");
  assert.equal(message.lockedUntilUtc.getTime(), renewed.getTime(), "the message shows it");
  await t.sleep(lockMs * 0.6); // past the first lock's expiry
  await manual.completeMessage(message);

  const auto = t.receiver("renewal"); // maxAutoLockRenewalDurationInMs: 5 minutes by default
  const [held] = await t.receiveAll(auto, 1);
  assert.equal(held.messageId, t.id("auto"));
  await t.sleep(lockMs * 1.4);
  await auto.completeMessage(held);
  assert.deepEqual(await auto.peekMessages(5), [], "both completed");
};
