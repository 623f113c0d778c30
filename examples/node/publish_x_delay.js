// Publish with an x-delay header, as a producer of the x-delayed-message
// plugin does, through delayline's AMQP ingress, and consume the message.
//
// Needs an ingress in delayline's configuration ([[ingress]] with exchange
// = INGRESS_EXCHANGE, deliver_to = DELIVER_TO, type = "direct"; see
// docs/plugin.md). Declares nothing delayline declares: both exchanges are
// checked (checkExchange). Exits 0 once the message came, never early; 1 if
// it did not within 30 s. Environment (defaults in brackets): AMQP_URI
// [amqp://guest:guest@127.0.0.1:5672/%2f], INGRESS_EXCHANGE
// [my-exchange.delayed], DELIVER_TO [my-exchange], QUEUE [examples.node.x-delay],
// ROUTING_KEY [my-key].
const amqp = require("amqplib");
const { randomUUID } = require("node:crypto");

const env = (name, fallback) => process.env[name] || fallback;

async function main() {
  const ingress = env("INGRESS_EXCHANGE", "my-exchange.delayed");
  const deliverTo = env("DELIVER_TO", "my-exchange");
  const queue = env("QUEUE", "examples.node.x-delay");
  const key = env("ROUTING_KEY", "my-key");
  const connection = await amqp.connect(env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f"));
  const channel = await connection.createConfirmChannel();
  await channel.checkExchange(ingress);
  await channel.checkExchange(deliverTo);
  await channel.assertQueue(queue, { durable: true });
  await channel.bindQueue(queue, deliverTo, key);

  const messageId = randomUUID();
  const sent = Date.now();
  channel.publish(ingress, key, Buffer.from("delayed payload"), {
    headers: { "x-delay": 1000 },
    messageId,
    persistent: true,
  });
  await channel.waitForConfirms();
  console.log("published", messageId, "with x-delay 1000");

  const arrived = new Promise((resolve, reject) => {
    setTimeout(() => reject(new Error("the message did not arrive within 30 s")), 30_000).unref();
    channel.consume(queue, (message) => {
      channel.ack(message);
      if (message.properties.messageId !== messageId) return;
      const waited = Date.now() - sent;
      if (waited < 1000) return reject(new Error(`early: after ${waited} ms`));
      console.log("message", messageId, "arrived after", waited, "ms:", message.content.toString());
      resolve();
    });
  });
  await arrived;
  await connection.close();
}

main().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
