// Message ids of every AMQP type the client sends (string, ulong from a number, uuid from a
// 16-byte Buffer) come back with their type, and duplicate detection applies to each.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const uuid = Buffer.from("0123456789abcdef0123456789abcdef", "hex");
  const sender = t.sender("idtypes");
  for (const [messageId, body] of [
    [t.id("text"), "text"],
    [t.id("text"), "text again"],
    [4_000_000_001, "number"],
    [4_000_000_001, "number again"],
    [uuid, "uuid"],
    [Buffer.from(uuid), "uuid again"],
  ]) {
    await sender.sendMessages({ body, messageId });
  }
  const receiver = t.receiver("idtypes", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 6, 1000);
  assert.deepEqual(
    received.map((m) => [m.messageId, m.body]),
    [
      [t.id("text"), "text"],
      [4_000_000_001, "number"],
      [uuid, "uuid"],
    ],
  );
};
