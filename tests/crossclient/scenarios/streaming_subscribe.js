// subscribe() streams messages to a handler and settles each one it returns from.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const ids = Array.from({ length: 20 }, (_, i) => t.id(`m${i}`));
  await t
    .sender("streaming")
    .sendMessages(ids.map((messageId) => ({ body: messageId, messageId })));

  const receiver = t.receiver("streaming");
  const seen = [];
  const errors = [];
  let subscription;
  await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`only ${seen.length} messages streamed`)),
      20_000,
    );
    subscription = receiver.subscribe(
      {
        async processMessage(message) {
          seen.push(message.messageId);
          if (seen.length === ids.length) {
            clearTimeout(timer);
            resolve();
          }
        },
        async processError(args) {
          errors.push(args.error);
        },
      },
      { maxConcurrentCalls: 4 },
    );
    t.track(subscription);
  });
  assert.deepEqual([...seen].sort(), [...ids].sort(), "each message streamed once");
  assert.deepEqual(errors, []);
  // autoCompleteMessages (the default) completes each one once its handler returned. Peek sees
  // locked messages too, so an empty peek means every message is gone.
  await subscription.close();
  await t.expectDrained("streaming");
};
