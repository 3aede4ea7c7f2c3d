// A session receiver gets its session's messages in order, and the session state it sets is
// what the next holder of the session reads.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("sessions");
  const ids = [0, 1, 2, 3].map((i) => t.id(`s1-${i}`));
  await sender.sendMessages(
    ids.map((messageId) => ({ body: messageId, messageId, sessionId: "s1" })),
  );
  await sender.sendMessages({ body: "other", messageId: t.id("s2-0"), sessionId: "s2" });

  const first = await t.acceptSession("sessions", "s1");
  assert.equal(first.sessionId, "s1");
  assert.ok(first.sessionLockedUntilUtc > new Date(), "sessionLockedUntilUtc");
  assert.equal(await first.getSessionState(), null, "a new session has no state");
  const received = await t.receiveAll(first, ids.length);
  assert.deepEqual(
    received.map((m) => m.messageId),
    ids,
    "in order, and only session s1's",
  );
  for (const m of received) {
    assert.equal(m.sessionId, "s1");
    await first.completeMessage(m);
  }
  await first.setSessionState(Buffer.from("checkpoint:3"));
  const lockedUntil = await first.renewSessionLock();
  assert.ok(lockedUntil > new Date(), "renewSessionLock returns the new expiry");
  await first.close();

  const second = await t.acceptSession("sessions", "s1");
  assert.deepEqual(await second.getSessionState(), Buffer.from("checkpoint:3"));
  await second.setSessionState(null);
  assert.equal(await second.getSessionState(), null, "state cleared");
  await t.expectEmpty(second); // last on this session receiver (expectEmpty)
  await second.close();

  const other = await t.acceptSession("sessions", "s2", { receiveMode: "receiveAndDelete" });
  const rest = await t.receiveAll(other, 1);
  assert.deepEqual(
    rest.map((m) => m.messageId),
    [t.id("s2-0")],
  );
};
