// A session lock that is not renewed expires: the holder's calls fail with SessionLockLost, the
// session is free for the next receiver, and its unsettled message comes again.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("sessionexpiry").sendMessages({
    body: "x",
    messageId: t.id("x"),
    sessionId: "s",
  });
  const before = Date.now();
  const holder = await t.acceptSession("sessionexpiry", "s", { maxAutoLockRenewalDurationInMs: 0 });
  t.assertLockedFor(holder.sessionLockedUntilUtc, before, Date.now(), "session accepted");
  const [message] = await t.receiveAll(holder, 1);
  await t.sleep(holder.sessionLockedUntilUtc.getTime() - Date.now() + 500);

  await t.expectServiceBusError(holder.completeMessage(message), "SessionLockLost");
  await t.expectServiceBusError(holder.renewSessionLock(), "SessionLockLost");

  const next = await t.acceptSession("sessionexpiry", "s");
  const [again] = await t.receiveAll(next, 1);
  assert.equal(again.messageId, t.id("x"));
  assert.equal(again.deliveryCount, 1, "the expired delivery counts");
  await next.completeMessage(again);
};
