// Known divergence: message property quotas. Service Bus refuses a message property over 32 KB
// (and headers over 64 KB); the emulator accepts and delivers it.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas";

module.exports.run = async (t) => {
  const big = "x".repeat(40 * 1024);
  const refused = await t.errorOf(
    t.sender("quotas").sendMessages({
      body: "small body",
      messageId: t.id("big-property"),
      applicationProperties: { big },
    }),
  );
  t.stillDiverges(refused === undefined, "a 40 KB application property is accepted");

  const receiver = t.receiver("quotas", { receiveMode: "receiveAndDelete" });
  const [received] = await t.receiveAll(receiver, 1);
  assert.equal(received.applicationProperties.big, big, "and delivered intact");
};
