// The entity's maximum message size (64 KB here) is advertised on the sender link: the client
// sizes batches by it, and the broker refuses a larger single message with MessageSizeExceeded,
// storing nothing.
"use strict";

const assert = require("node:assert/strict");

const LIMIT = 64 * 1024;

module.exports.run = async (t) => {
  const sender = t.sender("sizes");
  const batch = await sender.createMessageBatch();
  assert.equal(batch.maxSizeInBytes, LIMIT, "max-message-size from the link attach");
  assert.equal(
    batch.tryAddMessage({ body: Buffer.alloc(LIMIT), messageId: t.id("too-big-for-batch") }),
    false,
  );

  const fits = { body: Buffer.alloc(LIMIT - 1024, 1), messageId: t.id("fits") };
  await sender.sendMessages(fits);
  await t.expectServiceBusError(
    sender.sendMessages({ body: Buffer.alloc(LIMIT + 1024, 2), messageId: t.id("too-big") }),
    "MessageSizeExceeded",
  );

  const receiver = t.newClient().createReceiver("sizes", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2, 1500);
  assert.deepEqual(
    received.map((m) => m.messageId),
    [t.id("fits")],
    "only the message that fits",
  );
  assert.equal(received[0].body.length, LIMIT - 1024);
};
