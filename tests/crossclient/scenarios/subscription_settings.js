// Each subscription has its own settings (sessions, lock duration, max delivery count), as on
// Service Bus; the topic "subsettings" has none of them. "strict" dead-letters after 2
// deliveries, "quick" locks for 2 s, "ordered" requires sessions and dead-letters the copy of
// a message without a session id ("Session id is null."), "plain" has the defaults.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("subsettings");
  await sender.sendMessages({ body: "a", messageId: t.id("loose") });
  await sender.sendMessages({ body: "b", messageId: t.id("keyed"), sessionId: "s1" });

  const plain = t.receiver("subsettings", "plain", { receiveMode: "receiveAndDelete" });
  const both = await t.receiveAll(plain, 2);
  assert.deepEqual(
    both.map((m) => m.messageId),
    [t.id("loose"), t.id("keyed")],
  );

  const strict = t.receiver("subsettings", "strict");
  for (let attempt = 0; attempt < 2; attempt += 1) {
    const batch = await t.receiveAll(strict, 2);
    assert.equal(batch.length, 2, `delivery ${attempt + 1} of both messages`);
    for (const m of batch) {
      await strict.abandonMessage(m);
    }
  }
  await t.expectEmpty(strict);
  const strictDead = t.receiver("subsettings", "strict", {
    subQueueType: "deadLetter",
    receiveMode: "receiveAndDelete",
  });
  const dead = await t.receiveAll(strictDead, 2);
  assert.deepEqual(
    dead.map((m) => m.deadLetterReason),
    ["MaxDeliveryCountExceeded", "MaxDeliveryCountExceeded"],
  );

  const quick = t.receiver("subsettings", "quick", { maxAutoLockRenewalDurationInMs: 0 });
  const before = Date.now();
  const [locked] = await t.receiveAll(quick, 1);
  const until = locked.lockedUntilUtc.getTime();
  assert.ok(
    until >= before + 1000 && until <= Date.now() + 3000,
    `quick: locked until ${locked.lockedUntilUtc.toISOString()}, not about 2 s after the call`,
  );
  // Nothing is settled under a 2 s lock (a busy machine can take longer): once it expires, a
  // receive-and-delete receiver takes both messages, the expired one delivered again.
  const drain = t.receiver("subsettings", "quick", { receiveMode: "receiveAndDelete" });
  const taken = await t.receiveAll(drain, 2);
  assert.deepEqual(
    taken.map((m) => m.messageId).sort(),
    [t.id("keyed"), t.id("loose")].sort(),
  );
  assert.equal(
    taken.find((m) => m.messageId === locked.messageId).deliveryCount,
    1,
    "the message whose 2 s lock expired comes again",
  );

  const session = await t.acceptSession("subsettings", "ordered", "s1");
  const [keyed] = await t.receiveAll(session, 1);
  assert.equal(keyed.messageId, t.id("keyed"));
  await session.completeMessage(keyed);
  const orderedDead = t.receiver("subsettings", "ordered", {
    subQueueType: "deadLetter",
    receiveMode: "receiveAndDelete",
  });
  const [sessionless] = await t.receiveAll(orderedDead, 1);
  assert.equal(sessionless.messageId, t.id("loose"));
  assert.equal(sessionless.deadLetterReason, "Session id is null.");
};
