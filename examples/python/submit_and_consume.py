"""Submit a task over HTTP and consume it when it is due.

Binds a queue of its own to the business exchange with the destination,
schedules one task a second from now with POST /v1/tasks, and waits for it:
it prints how late it came (never early) and exits 0, or exits 1 if it has
not come within 30 s. Configured by the environment (defaults in brackets):
DELAYLINE_URL [http://127.0.0.1:8080], DELAYLINE_TOKEN [none], AMQP_URI
[amqp://guest:guest@127.0.0.1:5672/%2f], BUSINESS_EXCHANGE
[delayline.business], QUEUE [examples.python.invoices], DESTINATION
[billing.invoice].
"""
import json
import os
import sys
import time

import httpx
import pika


def env(name, default):
    return os.environ.get(name, default)


def main():
    queue = env("QUEUE", "examples.python.invoices")
    destination = env("DESTINATION", "billing.invoice")
    connection = pika.BlockingConnection(
        pika.URLParameters(env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f"))
    )
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_bind(queue, env("BUSINESS_EXCHANGE", "delayline.business"), routing_key=destination)

    headers = {}
    if os.environ.get("DELAYLINE_TOKEN"):
        headers["authorization"] = "Bearer " + os.environ["DELAYLINE_TOKEN"]
    answer = httpx.post(
        env("DELAYLINE_URL", "http://127.0.0.1:8080") + "/v1/tasks",
        json={"destination": destination, "delay": "1s", "payload": {"invoice": 42}},
        headers=headers,
    )
    answer.raise_for_status()
    task = answer.json()
    print("scheduled", task["id"], "for", task["deliver_at"], flush=True)

    deadline = time.time() + 30
    for method, properties, body in channel.consume(queue, inactivity_timeout=1):
        if time.time() > deadline:
            print("the task did not arrive within 30 s", file=sys.stderr)
            return 1
        if method is None:
            continue
        channel.basic_ack(method.delivery_tag)
        if properties.message_id != task["id"]:
            continue
        lateness_ms = time.time() * 1000 - int(properties.headers["x-deliver-at-ms"])
        if lateness_ms < 0:
            print("early by", -lateness_ms, "ms", file=sys.stderr)
            return 1
        print("task", task["id"], "arrived", round(lateness_ms), "ms after its time:", json.loads(body), flush=True)
        connection.close()
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
