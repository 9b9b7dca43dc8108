"""Reads a topic as a Python user of wal2delta would (docs/types.md, "Reading events from
other languages"): confluent-kafka's DeserializingConsumer with its schema-registry
AvroDeserializer (fastavro underneath) for keys and values, default settings.

    avro_consumer.py BROKERS REGISTRY_URL TOPIC COUNT TIMEOUT_SECONDS

Reads the topic's partitions from the beginning (assigned, no consumer-group commits)
until COUNT records arrived or the timeout passed, then prints them as a JSON list of
{"partition", "offset", "key", "value"} (a tombstone's value is null); a value the
deserializer gave as a decimal.Decimal is printed as {"decimal": "12.50"}, so a reader
of the output can tell a Decimal from a string. A record the
deserializer refuses ends the script with exit status 1 and the deserializer's error on
stderr: that is the failure a Python consumer would see.
"""
import decimal
import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, DeserializingConsumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer


def main():
    brokers, registry, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    count, timeout = int(sys.argv[4]), float(sys.argv[5])
    client = SchemaRegistryClient({"url": registry})
    consumer = DeserializingConsumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "wal2delta-tests-py",
            "enable.auto.commit": False,
            "key.deserializer": AvroDeserializer(client),
            "value.deserializer": AvroDeserializer(client),
        }
    )
    try:
        deadline = time.monotonic() + timeout
        partitions = []
        while not partitions and time.monotonic() < deadline:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            partitions = sorted(meta.partitions) if meta is not None and meta.error is None else []
            if not partitions:
                time.sleep(0.5)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records = []
        while len(records) < count and time.monotonic() < deadline:
            try:
                msg = consumer.poll(0.5)
            except Exception as e:  # the deserializer's refusal, as a user meets it
                print(f"cannot deserialize a record of {topic}: {type(e).__name__}: {e}", file=sys.stderr)
                sys.exit(1)
            if msg is None:
                continue
            if msg.error():
                print(f"consumer error: {msg.error()}", file=sys.stderr)
                sys.exit(1)
            records.append(
                {"partition": msg.partition(), "offset": msg.offset(), "key": msg.key(), "value": msg.value()}
            )
    finally:
        consumer.close()
    json.dump(records, sys.stdout, default=lambda v: {"decimal": format(v, "f")} if isinstance(v, decimal.Decimal) else str(v))


if __name__ == "__main__":
    main()
