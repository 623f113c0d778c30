-- A task taken in over AMQP (an ingress) keeps its message's properties
-- whole, as AMQP encodes a content header's properties: every header type a
-- client sent, content encoding, correlation id, reply-to, priority, type,
-- app id, timestamp. A forwarder's retry or a move publishes them again.
-- NULL for a task submitted over HTTP.
--
-- A task may also be delivered to another exchange than the business
-- exchange (an ingress's, or one a task over HTTP names): `exchange`, NULL
-- for the business exchange.
ALTER TABLE tasks ADD COLUMN properties BYTEA;
ALTER TABLE tasks ADD COLUMN exchange TEXT;
