// A peeked message's deliveryCount is the number of deliveries so far, as Service Bus reports
// it: 0 for a message never received, 1 after one abandon.
// https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceivedmessage.deliverycount
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("peekcount").sendMessages({ body: "x", messageId: t.id("x") });
  const receiver = t.receiver("peekcount");

  const [fresh] = await receiver.peekMessages(1);
  assert.equal(fresh.deliveryCount, 0, "peek of a never-delivered message");

  const [received] = await t.receiveAll(receiver, 1);
  assert.equal(received.deliveryCount, 0, "receive: header delivery-count of a first delivery");
  await receiver.abandonMessage(received);

  const [abandoned] = await receiver.peekMessages(1, {
    fromSequenceNumber: received.sequenceNumber,
  });
  assert.equal(abandoned.deliveryCount, 1, "peek after one abandon");

  const [again] = await t.receiveAll(receiver, 1);
  assert.equal(again.deliveryCount, 1, "receive after one abandon");
  await receiver.completeMessage(again);
};
