"""Every Delta table read and write: the job's tables and their commit tags
(:mod:`~js_etl.delta.table`), what a table holds of a round's sequences
(:mod:`~js_etl.delta.keys`), the rules a table imposes on a writer (:mod:`~js_etl.delta.rules`),
task-written Parquet files (:mod:`~js_etl.delta.files`) and the backfill's MERGE
(:mod:`~js_etl.delta.merge`). The only importer of ``deltalake`` and ``delta``."""
