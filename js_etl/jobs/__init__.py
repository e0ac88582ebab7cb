"""The spark-submit entry points, inside the package so that a wheel install has them too.

``drain.py`` runs ``js-etl drain`` and ``backfill.py`` runs ``js-etl backfill`` on the session
spark-submit prepared; each file is both a module (``main()``) and the script spark-submit runs.
The Airflow operator submits these files by default; the repository's top-level
``jobs/drain_to_delta.py`` and ``jobs/backfill_to_delta.py`` are thin scripts calling the same
``main()``. Where the installed files are:

    python -c 'import js_etl.jobs.drain as job; print(job.__file__)'
"""
