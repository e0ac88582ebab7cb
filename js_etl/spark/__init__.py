"""Spark plumbing: starting a session with Delta (:mod:`~js_etl.spark.session`), Delta's jars
(:mod:`~js_etl.spark.jars`), and reading a failed Spark job's cause
(:mod:`~js_etl.spark.failures`). Importing this package does not import pyspark."""
