// A session lock that is not renewed expires: the holder's calls fail with SessionLockLost, the
// session is free for the next receiver, and its unsettled message comes again.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const lockMs = Number(process.env.CROSSCLIENT_LOCK_DURATION_MS || "5000");
  await t.sender("sessionexpiry").sendMessages({
    body: "x",
    messageId: t.id("x"),
    sessionId: "s",
  });
  const holder = await t.acceptSession("sessionexpiry", "s", { maxAutoLockRenewalDurationInMs: 0 });
  const left = holder.sessionLockedUntilUtc.getTime() - Date.now();
  assert.ok(
    left > lockMs * 0.5 && left <= lockMs + 1000,
    `session locked for ~${lockMs} ms (${left})`,
  );
  const [message] = await t.receiveAll(holder, 1);
  await t.sleep(left + 500);

  await t.expectServiceBusError(holder.completeMessage(message), "SessionLockLost");
  await t.expectServiceBusError(holder.renewSessionLock(), "SessionLockLost");

  const next = await t.acceptSession("sessionexpiry", "s");
  const [again] = await t.receiveAll(next, 1);
  assert.equal(again.messageId, t.id("x"));
  assert.equal(again.deliveryCount, 1, "the expired delivery counts");
  await next.completeMessage(again);
};
