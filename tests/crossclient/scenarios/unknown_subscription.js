// A receiver on a subscription that does not exist (a typo) is refused with
// MessagingEntityNotFound, as Service Bus refuses the link; a peek likewise.
"use strict";

module.exports.run = async (t) => {
  const client = t.newClient({ retryOptions: { timeoutInMs: 2000 } });
  const receiver = t.track(client.createReceiver("fanout", "no-such-subscription"));
  await t.expectServiceBusError(
    receiver.receiveMessages(1, { maxWaitTimeInMs: 500 }),
    "MessagingEntityNotFound",
  );
  const peeker = t.track(client.createReceiver("fanout", "no-such-subscription"));
  await t.expectServiceBusError(peeker.peekMessages(1), "MessagingEntityNotFound");
};
