// receiveAndDelete: messages are gone once received, carry no lock, and cannot be settled.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const ids = [0, 1, 2].map((i) => t.id(`m${i}`));
  await t
    .sender("destructive")
    .sendMessages(ids.map((messageId) => ({ body: messageId, messageId })));
  const receiver = t.receiver("destructive", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, ids.length);
  assert.deepEqual(
    received.map((m) => m.messageId),
    ids,
  );
  assert.equal(received[0].lockToken, undefined);
  await assert.rejects(receiver.completeMessage(received[0]), /receiveAndDelete/);
  assert.deepEqual(await receiver.peekMessages(5), [], "nothing left");
};
