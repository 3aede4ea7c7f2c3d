// A message sent without a time to live on an entity with a default one (1 h here): Service
// Bus applies and reports the entity's default (timeToLive, and expiresAtUtc =
// enqueuedTimeUtc + 1 h), in a peek and on receipt. A shorter time to live is kept as sent; a
// longer one is "silently adjusted" to the entity's
// (https://learn.microsoft.com/azure/service-bus-messaging/message-expiration).
"use strict";

const assert = require("node:assert/strict");

const HOUR = 3600 * 1000;

function assertTimesToLive(none, own, long, where) {
  assert.equal(none.timeToLive, HOUR, `${where}: no time to live reads the entity's`);
  assert.equal(none.expiresAtUtc.getTime(), none.enqueuedTimeUtc.getTime() + HOUR, where);
  assert.equal(own.timeToLive, 60_000, `${where}: a shorter one is kept`);
  assert.equal(own.expiresAtUtc.getTime(), own.enqueuedTimeUtc.getTime() + 60_000, where);
  assert.equal(long.timeToLive, HOUR, `${where}: a longer one is cut to the entity's`);
  assert.equal(long.expiresAtUtc.getTime(), long.enqueuedTimeUtc.getTime() + HOUR, where);
}

module.exports.run = async (t) => {
  await t.sender("defaultttl").sendMessages([
    { body: "no ttl", messageId: t.id("none") },
    { body: "own ttl", messageId: t.id("own"), timeToLive: 60_000 },
    { body: "long ttl", messageId: t.id("long"), timeToLive: 48 * HOUR },
  ]);
  const [pNone, pOwn, pLong] = await t.peekFromStart("defaultttl");
  assertTimesToLive(pNone, pOwn, pLong, "peek");

  const receiver = t.receiver("defaultttl", { receiveMode: "receiveAndDelete" });
  const [none, own, long] = await t.receiveAll(receiver, 3);
  assertTimesToLive(none, own, long, "receive");
};
