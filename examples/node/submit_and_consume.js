// Submit a task over HTTP and consume it when it is due.
//
// Binds a queue of its own to the business exchange with the destination,
// schedules one task a second from now with POST /v1/tasks (Node's own
// fetch), and waits for it: prints how late it came (never early) and exits
// 0, or exits 1 if it has not come within 30 s. Environment (defaults in
// brackets): DELAYLINE_URL [http://127.0.0.1:8080], DELAYLINE_TOKEN [none],
// AMQP_URI [amqp://guest:guest@127.0.0.1:5672/%2f], BUSINESS_EXCHANGE
// [delayline.business], QUEUE [examples.node.invoices], DESTINATION
// [billing.invoice].
const amqp = require("amqplib");

const env = (name, fallback) => process.env[name] || fallback;

async function main() {
  const queue = env("QUEUE", "examples.node.invoices");
  const destination = env("DESTINATION", "billing.invoice");
  const connection = await amqp.connect(env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f"));
  const channel = await connection.createChannel();
  await channel.assertQueue(queue, { durable: true, arguments: { "x-queue-type": "quorum" } });
  await channel.bindQueue(queue, env("BUSINESS_EXCHANGE", "delayline.business"), destination);

  const headers = { "content-type": "application/json" };
  if (process.env.DELAYLINE_TOKEN) headers.authorization = `Bearer ${process.env.DELAYLINE_TOKEN}`;
  const answer = await fetch(`${env("DELAYLINE_URL", "http://127.0.0.1:8080")}/v1/tasks`, {
    method: "POST",
    headers,
    body: JSON.stringify({ destination, delay: "1s", payload: { invoice: 42 } }),
  });
  if (answer.status !== 202) throw new Error(`POST /v1/tasks answered ${answer.status}: ${await answer.text()}`);
  const task = await answer.json();
  console.log("scheduled", task.id, "for", task.deliver_at);

  const arrived = new Promise((resolve, reject) => {
    setTimeout(() => reject(new Error("the task did not arrive within 30 s")), 30_000).unref();
    channel.consume(queue, (message) => {
      channel.ack(message);
      if (message.properties.messageId !== task.id) return;
      const lateness = Date.now() - Number(message.properties.headers["x-deliver-at-ms"]);
      if (lateness < 0) return reject(new Error(`early by ${-lateness} ms`));
      console.log("task", task.id, "arrived", lateness, "ms after its time:", JSON.parse(message.content.toString()));
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
