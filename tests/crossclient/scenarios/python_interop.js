// Between the two official clients: what the Python client sent (before this run) arrives here
// as it was sent, and what this client sends is checked by the Python test after the run
// (interop.json lists both directions' messages).
"use strict";

const assert = require("node:assert/strict");
const path = require("node:path");

const { messages } = require(path.join(__dirname, "..", "interop.json"));

/**
 * What this client reads from the Python client's application properties: the Python client
 * encodes booleans as AMQP's one-octet form (0x56), which rhea decodes as the number 0 or 1,
 * and the emulator passes the sender's encoding through unchanged.
 */
function asReadFromPython(properties) {
  return Object.fromEntries(
    Object.entries(properties).map(([key, value]) => [
      key,
      typeof value === "boolean" ? Number(value) : value,
    ]),
  );
}

module.exports.run = async (t) => {
  // The bytes as sent: by default the client would JSON.parse a data body that parses.
  const receiver = t.receiver("from-python", {
    receiveMode: "receiveAndDelete",
    skipParsingBodyAsJson: true,
  });
  const received = await t.receiveAll(receiver, messages.length);
  assert.deepEqual(
    received.map((m) => m.messageId),
    messages.map((m) => m.messageId),
    "every message the Python client sent, in order",
  );
  received.forEach((m, i) => {
    const sent = messages[i];
    assert.equal(m._rawAmqpMessage.bodyType, "data", `${sent.messageId}: a data body`);
    assert.deepEqual(
      Buffer.from(m.body),
      Buffer.from(sent.body, "utf8"),
      `${sent.messageId}: body`,
    );
    for (const field of ["contentType", "subject", "correlationId"]) {
      assert.equal(m[field], sent[field], `${sent.messageId}: ${field}`);
    }
    assert.deepEqual(
      m.applicationProperties ?? {},
      asReadFromPython(sent.applicationProperties),
      `${sent.messageId}: applicationProperties`,
    );
  });

  await t
    .sender("to-python")
    .sendMessages(messages.map((m) => ({ ...m, body: Buffer.from(m.body, "utf8") })));
};
