// Peek browses without locking, continues where the previous peek stopped, and starts from a
// given sequence number.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("peeking");
  const ids = [0, 1, 2, 3, 4].map((i) => t.id(`m${i}`));
  await sender.sendMessages(ids.map((messageId) => ({ body: messageId, messageId })));

  const receiver = t.receiver("peeking");
  const firstTwo = await receiver.peekMessages(2);
  assert.deepEqual(
    firstTwo.map((m) => m.messageId),
    ids.slice(0, 2),
  );
  const nextTwo = await receiver.peekMessages(2);
  assert.deepEqual(
    nextTwo.map((m) => m.messageId),
    ids.slice(2, 4),
    "peek continues",
  );
  for (const m of [...firstTwo, ...nextTwo]) {
    assert.equal(m.lockToken, undefined, "a peeked message carries no lock");
  }

  const third = firstTwo[1].sequenceNumber.add(1);
  const fromThird = await receiver.peekMessages(10, { fromSequenceNumber: third });
  assert.deepEqual(
    fromThird.map((m) => m.messageId),
    ids.slice(2),
    "peek from a sequence number",
  );
  assert.deepEqual(
    fromThird.map((m) => m.sequenceNumber.toNumber()),
    [0, 1, 2].map((i) => third.toNumber() + i),
    "sequence numbers are consecutive",
  );
  const beyond = await receiver.peekMessages(10, { fromSequenceNumber: third.add(100) });
  assert.deepEqual(beyond, [], "nothing beyond the last sequence number");

  // Peeking locked nothing: every message can still be received.
  const received = await t.receiveAll(receiver, ids.length);
  assert.deepEqual(
    received.map((m) => m.messageId),
    ids,
  );
  for (const m of received) {
    await receiver.completeMessage(m);
  }
};
