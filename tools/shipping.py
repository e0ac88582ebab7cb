"""js-etl's wheel, and the packed Python environment that ships it to Spark executors.

:func:`build_wheel` is how the wheel is built for the executors (tests/tools/test_wheel.py runs it
from outside the checkout, tests/cluster and ``js-etl bench --cluster`` ship it to a standalone
cluster). It builds this source checkout, so it needs one: js-etl imported from an installed
wheel has none (:class:`ShippingError`, exit 2). It needs pip's build isolation: the venv's own
setuptools is older than the one pyproject.toml requires.

:func:`packed_env` runs the commands of docs/running.md for the executors' Python ("Running on a
cluster"): a new venv, the wheel installed ``--no-deps`` plus only what executors import
(pyarrow, numpy, nats-py, nkeys, PyYAML — pinned to the versions of the driver's venv, so
both ends pickle and exchange Arrow data with the same libraries), packed with ``venv-pack``.
``venv-pack`` comes with the ``dev`` extra; without it :func:`packed_env` raises
:class:`ShippingError` saying so. The archive is cached under the checkout's
``.cache/executor-env/<key>/`` (ignored by git), keyed by the wheel's contents and those pins,
so a rerun with an unchanged package reuses it.

Spark platform brings its own pyspark: :func:`platform_env` builds such an environment (a
given pyspark, js-etl's wheel with its ``job`` extra, no delta-spark) to run the job as there.

Dev tooling, like :mod:`js_etl.demo.server`: no pytest here; a failed command raises
:class:`ShippingError` with the command and the tail of its output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib.metadata import version
from pathlib import Path

from js_etl.errors import TerminalError
from js_etl.spark.jars import source_checkout

# The repository root when js_etl runs from its source checkout, else None (an installed wheel).
REPO = source_checkout()
PYTHON = sys.executable
CACHE = REPO / ".cache" / "executor-env" if REPO is not None else None

# An archive of another key (older sources) is deleted only after this long unused: longer than
# a `js-etl bench --cluster 1,2,4` or a test session that may still be submitting it.
PRUNE_AFTER = 3 * 3600.0

# What js-etl's executor side imports, as distribution names. Not pandas: neither js-etl's
# executor code nor PySpark's worker imports it for mapPartitions and mapInArrow (pyarrow only
# uses it if present). Without it the archive went from 111 to 88 MiB; the cluster test's
# executors run on it (tests/cluster/test_spark_cluster.py).
EXECUTOR_DEPS = ("pyarrow", "numpy", "nats-py", "nkeys", "PyYAML")
# Every distribution js-etl's core and `job` extra name (pyproject.toml).
JOB_DEPS = (*EXECUTOR_DEPS, "pandas", "deltalake", "obstore")


class ShippingError(TerminalError):
    """The wheel or the executors' environment could not be built (no source checkout, no
    venv-pack, or a failed command): something must be fixed first."""


def _run(args: list[str], timeout: float = 600, **kwargs: object) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False,
                          **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise ShippingError(f"{' '.join(map(str, args))} exited {done.returncode}\n"
                            f"{done.stdout[-3000:]}{done.stderr[-3000:]}")


def require_checkout() -> Path:
    """The source checkout the wheel is built from; :class:`ShippingError` without one."""
    if REPO is None:
        raise ShippingError("building js-etl's wheel for the executors needs its source "
                            "checkout; this js-etl is an installed package (run it from a clone "
                            "of the repository with `pip install -e '.[dev]'`)")
    return REPO


def venv_pack() -> Path:
    """The ``venv-pack`` of this venv (the ``dev`` extra); :class:`ShippingError` without it."""
    tool = Path(PYTHON).with_name("venv-pack")
    if not tool.exists():
        raise ShippingError(f"packing the executors' environment needs venv-pack (not found at "
                            f"{tool}): pip install -e '.[dev]'")
    return tool


def build_wheel(dest: Path) -> Path:
    """The wheel of this checkout, built into ``dest`` (about 4 s); its path."""
    repo = require_checkout()
    _run([PYTHON, "-m", "pip", "wheel", str(repo), "--no-deps", "-q", "-w", str(dest)])
    [wheel] = Path(dest).glob("js_etl-*.whl")
    return wheel


def platform_env(dest: Path, pyspark: str) -> Path:
    """A venv at ``dest`` as a Spark platform's Python with js-etl installed: ``pyspark`` of
    that version, the wheel of this checkout with its ``job`` extra pinned to this venv's
    versions, no delta-spark. Its python's path."""
    wheel = build_wheel(dest.parent / f"{dest.name}-dist")
    _run([*_bare_venv(dest), f"pyspark=={pyspark}", f"{wheel}[job]",
          *(f"{name}=={version(name)}" for name in JOB_DEPS)])
    return dest / "bin" / "python"


def _bare_venv(dest: Path) -> list[str]:
    """A venv at ``dest`` without pip (this venv's pip installs into it: ``pip --python``,
    which saves the venv's own ensurepip); the pip command that installs into it."""
    base = getattr(sys, "_base_executable", PYTHON)  # the venv's base interpreter
    _run([base, "-m", "venv", "--without-pip", str(dest)])
    # --no-compile: Python compiles what it imports; pip would compile every file (pyspark's
    # thousands) up front.
    return [PYTHON, "-m", "pip", "--python", str(dest / "bin" / "python"), "install", "-q",
            "--disable-pip-version-check", "--no-compile"]


def executor_requirements() -> list[str]:
    """The executor deps pinned to this (the driver's) venv."""
    return [f"{name}=={version(name)}" for name in EXECUTOR_DEPS]


def wheel_digest(wheel: Path) -> str:
    """A hash of the wheel's member names and contents (not of the zip: its timestamps change
    with every build of the same sources). Of ``METADATA`` only the headers count: its body is
    the README, whose edits change nothing the executors run; ``RECORD`` lists the hashes of
    the rest, METADATA's among them."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            data = zf.read(name)
            if name.endswith(".dist-info/METADATA"):
                data = data.split(b"\n\n", 1)[0]
            elif name.endswith(".dist-info/RECORD"):
                continue
            digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def packed_env(wheel: Path, cache: Path | None = None) -> Path:
    """``env.tar.gz`` for ``--archives env.tar.gz#environment``: built once per wheel content
    and requirement pins, then reused (a concurrent build of the same key only costs time: the
    archive is renamed into place whole). ``cache``: the checkout's ``.cache/executor-env``."""
    if cache is None:
        cache = require_checkout() / ".cache" / "executor-env"
    requirements = executor_requirements()
    key = hashlib.sha256("\n".join([wheel_digest(wheel), *requirements,
                                    sys.version]).encode()).hexdigest()[:16]
    archive = cache / key / "env.tar.gz"
    if archive.exists():
        os.utime(archive)  # in use again: not pruned by a build of another key (below)
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        env = Path(tmp) / "env"
        # No pip in the archive: smaller, and no ensurepip run to build it.
        pip = _bare_venv(env)
        _run([*pip, "--no-deps", str(wheel)])
        _run([*pip, *requirements])
        packed = Path(tmp) / "env.tar.gz"
        _run([str(venv_pack()), "-p", str(env), "-o", str(packed), "-q"])
        os.replace(packed, archive)
    # Keep the cache small: drop other keys' archives, but only those unused for PRUNE_AFTER
    # seconds. A bench or test session started before an edit of the sources still submits
    # its (older) archive for every leg: deleting it under them would fail their next submit.
    for old in cache.iterdir():
        previous = old / "env.tar.gz"
        if old != archive.parent and previous.exists() and not any(
                p.is_dir() for p in old.iterdir()) and (  # not a build under way
                time.time() - previous.stat().st_mtime > PRUNE_AFTER):
            shutil.rmtree(old, ignore_errors=True)
    return archive
