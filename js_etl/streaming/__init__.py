"""``js-etl stream``: the job's stream into its Delta tables as a Structured Streaming query
with ``Trigger.AvailableNow`` (:mod:`~js_etl.streaming.run`) — the ``nats_jetstream`` source's
micro-batches instead of a drain's durable consumer. Importing this package does not import
pyspark."""
