"""The durable consumer a drain owns: what makes it drainable, how a drain creates it, and the
explicit ``rewind`` that moves it. Speaks the job's vocabulary (``source.*``, ``fetch.*``) on top
of :mod:`js_etl.jetstream`, which speaks protocol only.

No Spark or Airflow import lives here.
"""
