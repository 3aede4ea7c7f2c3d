// A message sent to a topic reaches each subscription once; settling it in one subscription
// leaves the other's copy untouched.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const ids = [0, 1, 2].map((i) => t.id(`e${i}`));
  await t.sender("fanout").sendMessages(ids.map((messageId) => ({ body: messageId, messageId })));

  const billing = t.receiver("fanout", "billing");
  const shipping = t.receiver("fanout", "shipping");
  assert.equal(billing.entityPath, "fanout/Subscriptions/billing");

  const billed = await t.receiveAll(billing, ids.length);
  assert.deepEqual(
    billed.map((m) => m.messageId),
    ids,
  );
  for (const m of billed) {
    await billing.completeMessage(m);
  }
  await t.expectEmpty(billing);

  assert.deepEqual(
    (await shipping.peekMessages(10)).map((m) => m.messageId),
    ids,
  );
  const shipped = await t.receiveAll(shipping, ids.length);
  assert.deepEqual(
    shipped.map((m) => m.messageId),
    ids,
    "the other subscription has its copy",
  );
  await shipping.abandonMessage(shipped[0]);
  for (const m of shipped.slice(1)) {
    await shipping.completeMessage(m);
  }
  const [again] = await t.receiveAll(shipping, 1);
  assert.equal(again.messageId, ids[0]);
  assert.equal(again.deliveryCount, 1);
  await shipping.completeMessage(again);
  await t.expectEmpty(billing);
};
