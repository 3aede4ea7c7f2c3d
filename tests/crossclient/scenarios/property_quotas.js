// Message property quotas. Service Bus refuses a message with a property over 32 KB, or with
// properties over 64 KB together, as too large (MessageSizeExceeded), whatever the entity's
// maximum message size (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas);
// nothing of it is stored, and the sender goes on sending.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("quotas");
  const big = "x".repeat(40 * 1024);
  const refused = await t.expectServiceBusError(
    sender.sendMessages({
      body: "small body",
      messageId: t.id("big-property"),
      applicationProperties: { big },
    }),
    "MessageSizeExceeded",
  );
  assert.match(refused.message, /'big'/, "the error names the property");

  const thirty = "v".repeat(30_000);
  await t.expectServiceBusError(
    sender.sendMessages({
      body: "small body",
      messageId: t.id("many-properties"),
      applicationProperties: { a: thirty, b: thirty, c: thirty },
    }),
    "MessageSizeExceeded",
  );

  const fits = "y".repeat(30 * 1024);
  await sender.sendMessages({
    body: "small body",
    messageId: t.id("fits"),
    applicationProperties: { fits },
  });
  const receiver = t.receiver("quotas", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2, 1000);
  assert.deepEqual(
    received.map((m) => m.messageId),
    [t.id("fits")],
    "only the message within the quotas was stored",
  );
  assert.equal(received[0].applicationProperties.fits, fits);
};
