// Known divergence: the transfer dead-letter subqueue (<queue>/$Transfer/$DeadLetterQueue).
// Service Bus has one for every queue and subscription (empty unless forwarding or send-via
// failed, neither of which the emulator does); the emulator does not serve it: receiving and
// peeking fail instead of finding it empty.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues";

module.exports.run = async (t) => {
  const client = t.newClient({ retryOptions: { timeoutInMs: 2000 } });
  const receiver = t.track(
    client.createReceiver("transferdlq", { subQueueType: "transferDeadLetter" }),
  );
  assert.equal(receiver.entityPath, "transferdlq/$Transfer/$DeadLetterQueue");

  const received = await t.errorOf(receiver.receiveMessages(1, { maxWaitTimeInMs: 1000 }));
  t.stillDiverges(received !== undefined, "receiving from the transfer dead-letter subqueue fails");
  const peeked = await t.errorOf(receiver.peekMessages(1));
  t.stillDiverges(peeked !== undefined, "peeking the transfer dead-letter subqueue fails");
};
