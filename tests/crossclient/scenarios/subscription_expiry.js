// A subscription's own default time to live and dead-lettering on expiration, as on Service
// Bus: the topic "subexpiry" has neither; its subscription "brief" expires copies after 2 s
// into its dead-letter subqueue (TTLExpiredException), "lasting" keeps them.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("subexpiry").sendMessages({ body: "x", messageId: t.id("m") });
  await t.sleep(2500);
  const brief = t.receiver("subexpiry", "brief", { receiveMode: "receiveAndDelete" });
  await t.expectEmpty(brief);
  const dead = t.receiver("subexpiry", "brief", {
    subQueueType: "deadLetter",
    receiveMode: "receiveAndDelete",
  });
  const [expired] = await t.receiveAll(dead, 1);
  assert.equal(expired.messageId, t.id("m"));
  assert.equal(expired.deadLetterReason, "TTLExpiredException");
  const lasting = t.receiver("subexpiry", "lasting", { receiveMode: "receiveAndDelete" });
  const [kept] = await t.receiveAll(lasting, 1);
  assert.equal(kept.messageId, t.id("m"));
};
