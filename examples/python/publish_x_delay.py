"""Publish with an x-delay header, as a producer of the x-delayed-message
plugin does, through delayline's AMQP ingress, and consume the message.

Needs an ingress in delayline's configuration ([[ingress]] with exchange =
INGRESS_EXCHANGE, deliver_to = DELIVER_TO, type = "direct"); see
docs/plugin.md. Declares nothing delayline declares: both exchanges are
checked with a passive declare. Exits 0 once the message came, never
early; 1 if it did not within 30 s. Environment (defaults in brackets):
AMQP_URI [amqp://guest:guest@127.0.0.1:5672/%2f], INGRESS_EXCHANGE
[my-exchange.delayed], DELIVER_TO [my-exchange], QUEUE [examples.python.x-delay],
ROUTING_KEY [my-key].
"""
import os
import sys
import time
import uuid

import pika


def env(name, default):
    return os.environ.get(name, default)


def main():
    ingress = env("INGRESS_EXCHANGE", "my-exchange.delayed")
    deliver_to = env("DELIVER_TO", "my-exchange")
    queue = env("QUEUE", "examples.python.x-delay")
    key = env("ROUTING_KEY", "my-key")
    connection = pika.BlockingConnection(
        pika.URLParameters(env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f"))
    )
    channel = connection.channel()
    channel.exchange_declare(ingress, passive=True)
    channel.exchange_declare(deliver_to, passive=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, deliver_to, routing_key=key)
    channel.confirm_delivery()

    message_id = str(uuid.uuid4())
    sent_ms = time.time() * 1000
    channel.basic_publish(
        ingress,
        key,
        b"delayed payload",
        pika.BasicProperties(headers={"x-delay": 1000}, message_id=message_id, delivery_mode=2),
    )
    print("published", message_id, "with x-delay 1000", flush=True)

    deadline = time.time() + 30
    for method, properties, body in channel.consume(queue, inactivity_timeout=1):
        if time.time() > deadline:
            print("the message did not arrive within 30 s", file=sys.stderr)
            return 1
        if method is None:
            continue
        channel.basic_ack(method.delivery_tag)
        if properties.message_id != message_id:
            continue
        waited_ms = time.time() * 1000 - sent_ms
        if waited_ms < 1000:
            print("early: after", waited_ms, "ms", file=sys.stderr)
            return 1
        print("message", message_id, "arrived after", round(waited_ms), "ms:", body.decode(), flush=True)
        connection.close()
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
