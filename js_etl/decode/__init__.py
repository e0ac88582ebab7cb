"""Payload -> table row, or a dead letter with its reason. Three decoders give the same rows and
the same reasons (:mod:`~js_etl.decode.reasons`): Spark's ``from_json`` on the JVM for Spark's
writer (:mod:`~js_etl.decode.spark`), a payload-by-payload Python decoder
(:mod:`~js_etl.decode.arrow`), and one pyarrow parse of a whole batch where that provably gives
the same answer (:mod:`~js_etl.decode.json_batch`)."""
