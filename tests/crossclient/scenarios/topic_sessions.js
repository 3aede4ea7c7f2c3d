// Sessions on a topic: each subscription of a session-enabled topic hands out sessions on its
// own, so two subscriptions can hold the same session id at once.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const ids = [0, 1].map((i) => t.id(`m${i}`));
  await t
    .sender("sessiontopic")
    .sendMessages(ids.map((messageId) => ({ body: messageId, messageId, sessionId: "order-7" })));
  const audit = await t.acceptSession("sessiontopic", "audit", "order-7");
  const ship = await t.acceptSession("sessiontopic", "ship", "order-7");
  for (const receiver of [audit, ship]) {
    const received = await t.receiveAll(receiver, 2);
    assert.deepEqual(
      received.map((m) => m.messageId),
      ids,
      receiver.entityPath,
    );
    for (const m of received) {
      await receiver.completeMessage(m);
    }
  }
  await t.expectServiceBusError(
    t.newClient().acceptSession("sessiontopic", "audit", "order-7"),
    "SessionCannotBeLocked",
  );
};
