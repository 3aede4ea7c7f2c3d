// Known divergence: a message sent without a time to live on an entity with a default one (1 h
// here). Service Bus applies and reports the entity's default (timeToLive, and expiresAtUtc =
// enqueuedTimeUtc + 1 h); the emulator applies it but reports none (timeToLive undefined,
// expiresAtUtc at the end of time). A shorter message time to live is kept as sent.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusmessage.timetolive";

const HOUR = 3600 * 1000;

module.exports.run = async (t) => {
  await t.sender("defaultttl").sendMessages([
    { body: "no ttl", messageId: t.id("none") },
    { body: "own ttl", messageId: t.id("own"), timeToLive: 60_000 },
  ]);
  const receiver = t.receiver("defaultttl", { receiveMode: "receiveAndDelete" });
  const [none, own] = await t.receiveAll(receiver, 2);
  assert.equal(own.timeToLive, 60_000);
  assert.equal(own.expiresAtUtc.getTime(), own.enqueuedTimeUtc.getTime() + 60_000);

  t.stillDiverges(none.timeToLive === undefined, "timeToLive is undefined, not the entity's 1 h");
  t.stillDiverges(
    none.expiresAtUtc.getTime() > none.enqueuedTimeUtc.getTime() + 1000 * HOUR,
    "expiresAtUtc is the end of time, not enqueuedTimeUtc + 1 h",
  );
};
