// Flow control under load: 1,000 messages sent in batches are streamed to a handler with ten
// concurrent calls (the client's credit management over rhea), each exactly once, and the
// getMessageIterator path reads a second lot in order.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("manymessages");
  const ids = Array.from({ length: 1000 }, (_, i) => t.id(`m${i}`));
  for (let start = 0; start < ids.length; start += 250) {
    const batch = await sender.createMessageBatch();
    for (const messageId of ids.slice(start, start + 250)) {
      assert.ok(batch.tryAddMessage({ body: messageId, messageId }));
    }
    await sender.sendMessages(batch);
  }

  const receiver = t.receiver("manymessages");
  const seen = new Map();
  let subscription;
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${seen.size} streamed`)), 30_000);
    subscription = receiver.subscribe(
      {
        async processMessage(message) {
          seen.set(message.messageId, (seen.get(message.messageId) || 0) + 1);
          if (seen.size === ids.length) {
            clearTimeout(timer);
            resolve();
          }
        },
        async processError(args) {
          clearTimeout(timer);
          reject(args.error);
        },
      },
      { maxConcurrentCalls: 10 },
    );
  });
  await subscription.close();
  assert.equal(seen.size, ids.length);
  assert.deepEqual(
    [...seen.values()].filter((n) => n !== 1),
    [],
    "each message once",
  );
  await t.expectDrained("manymessages");

  const more = [0, 1, 2, 3, 4].map((i) => t.id(`iter${i}`));
  await sender.sendMessages(more.map((messageId) => ({ body: messageId, messageId })));
  const iterated = [];
  const iterating = t.receiver("manymessages", { receiveMode: "receiveAndDelete" });
  for await (const message of iterating.getMessageIterator()) {
    iterated.push(message.messageId);
    if (iterated.length === more.length) {
      break;
    }
  }
  assert.deepEqual(iterated, more);
};
