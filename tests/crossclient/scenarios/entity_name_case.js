// Entity and subscription names are case-insensitive, as Service Bus resolves them: "CASING"
// is the queue "casing" (one entity: a duplicate id sent through either name is dropped), and
// "CASETOPIC/Subscriptions/BILLING" is the subscription "billing" of topic "casetopic".
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("casing").sendMessages({ body: "x", messageId: t.id("lower") });
  await t.sender("CASING").sendMessages({ body: "x", messageId: t.id("upper") });
  await t.sender("Casing").sendMessages({ body: "x", messageId: t.id("lower") }); // a duplicate
  const receiver = t.receiver("cAsInG", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 3, 1000);
  assert.deepEqual(
    received.map((m) => m.messageId),
    [t.id("lower"), t.id("upper")],
  );

  await t.sender("CASETOPIC").sendMessages({ body: "x", messageId: t.id("fan") });
  const billing = t.receiver("CaseTopic", "BILLING", { receiveMode: "receiveAndDelete" });
  const [copy] = await t.receiveAll(billing, 1);
  assert.equal(copy.messageId, t.id("fan"));
  await t.expectDrained("casetopic", "billing");
};
