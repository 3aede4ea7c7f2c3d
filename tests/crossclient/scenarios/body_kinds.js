// Every AMQP body kind the JavaScript client sends arrives as it was sent: data (bytes, and
// the client's JSON encoding of strings and objects), AMQP value and AMQP sequence.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const cases = [
    { name: "bytes", message: { body: Buffer.from([0, 1, 2, 255]) }, bodyType: "data" },
    { name: "string", message: { body: "plain text" }, bodyType: "data" },
    { name: "json", message: { body: { order: 12345, items: [1, 2] } }, bodyType: "data" },
    { name: "value-number", message: { body: 3.25, bodyType: "value" }, bodyType: "value" },
    { name: "value-string", message: { body: "a value", bodyType: "value" }, bodyType: "value" },
    {
      name: "value-map",
      message: { body: { key: "v", n: 1, nested: [true, null] }, bodyType: "value" },
      bodyType: "value",
    },
    {
      name: "value-list",
      message: { body: [1, "two", false], bodyType: "value" },
      bodyType: "value",
    },
    {
      name: "sequence",
      message: {
        body: [
          [1, 2],
          ["a", "b"],
        ],
        bodyType: "sequence",
      },
      bodyType: "sequence",
    },
  ];
  const sender = t.sender("bodies");
  for (const c of cases) {
    const annotated = c.message.bodyType !== undefined;
    const message = annotated
      ? { ...c.message, properties: { messageId: t.id(c.name) } }
      : { ...c.message, messageId: t.id(c.name) };
    await sender.sendMessages(message);
  }

  const receiver = t.receiver("bodies", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, cases.length);
  assert.deepEqual(
    received.map((m) => m.messageId),
    cases.map((c) => t.id(c.name)),
    "every body kind received, in order",
  );
  received.forEach((m, i) => {
    const c = cases[i];
    assert.equal(m._rawAmqpMessage.bodyType, c.bodyType, `${c.name}: body type`);
    assert.deepEqual(m.body, c.message.body, `${c.name}: body`);
  });
};
