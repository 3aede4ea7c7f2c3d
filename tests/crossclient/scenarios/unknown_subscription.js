// Known divergence: a receiver on a subscription that does not exist (a typo). Service Bus
// refuses the link with MessagingEntityNotFound; the emulator accepts it and receives return
// nothing.
"use strict";

module.exports.divergence =
  "https://learn.microsoft.com/azure/service-bus-messaging/service-bus-messaging-exceptions-latest";

module.exports.run = async (t) => {
  const client = t.newClient({ retryOptions: { timeoutInMs: 2000 } });
  const receiver = t.track(client.createReceiver("fanout", "no-such-subscription"));
  let received;
  const error = await t.errorOf(
    receiver.receiveMessages(1, { maxWaitTimeInMs: 500 }).then((messages) => {
      received = messages;
    }),
  );
  t.stillDiverges(
    error === undefined && received.length === 0,
    "a receiver on a missing subscription is accepted and receives nothing",
  );
  const peekError = await t.errorOf(receiver.peekMessages(1));
  t.stillDiverges(
    peekError === undefined || peekError.code !== "MessagingEntityNotFound",
    "a peek on a missing subscription is not refused with MessagingEntityNotFound",
  );
};
