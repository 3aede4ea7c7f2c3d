// Lock duration is a setting of each queue (LockDuration): "lockshort" locks for 5 s and
// "locklong" for 30 s, in one emulator (the suite's other queues: 60 s); the short lock expires
// and the message is delivered again, the long one is still held.
"use strict";

const assert = require("node:assert/strict");

const SHORT_MS = 5000; // entities.json: lockshort

function assertLockedAbout(until, before, after, lockMs, what) {
  const slack = 1000;
  assert.ok(
    until.getTime() >= before + lockMs - slack && until.getTime() <= after + lockMs + slack,
    `${what}: locked until ${until.toISOString()}, not ${lockMs} ms after the call`,
  );
}

module.exports.run = async (t) => {
  await t.sender("lockshort").sendMessages({ body: "s", messageId: t.id("short") });
  await t.sender("locklong").sendMessages({ body: "l", messageId: t.id("long") });
  const short = t.receiver("lockshort", { maxAutoLockRenewalDurationInMs: 0 });
  const long = t.receiver("locklong", { maxAutoLockRenewalDurationInMs: 0 });

  let before = Date.now();
  const [first] = await t.receiveAll(short, 1);
  assertLockedAbout(first.lockedUntilUtc, before, Date.now(), SHORT_MS, "lockshort");
  before = Date.now();
  const [held] = await t.receiveAll(long, 1);
  assertLockedAbout(held.lockedUntilUtc, before, Date.now(), 30000, "locklong");

  before = Date.now();
  const renewed = await short.renewMessageLock(first);
  assertLockedAbout(renewed, before, Date.now(), SHORT_MS, "renewMessageLock on lockshort");

  await t.sleep(first.lockedUntilUtc.getTime() - Date.now() + 500);
  const [again] = await t.receiveAll(short, 1);
  assert.equal(again.messageId, t.id("short"));
  assert.equal(again.deliveryCount, 1, "one expired delivery before this one");
  await short.completeMessage(again);
  // Its message is still locked to `long`: another receiver gets nothing (and `long` does not
  // drain while it holds that lock: receiveAll).
  await t.expectEmpty(t.receiver("locklong"));
  await long.completeMessage(held);
  await t.expectDrained("lockshort");
  await t.expectDrained("locklong");
};
