"""The files beside a Delta table's log, on the local disk or in an object store (``s3://``).

A table's *root* is a local directory or an object-store URL. What the driver and the columnar
writer's tasks do there — write and read Parquet, list and read the log, keep the run's lock —
goes through :class:`TableFiles`, so that the same code serves both.

On an object store, js-etl reaches it with the libraries that commit to it, configured the same
way: ``deltalake`` (commits, Parquet streams) and ``obstore`` (small objects, listing, the lock's
create-if-absent), both read the store's endpoint, region and credentials from the standard
``AWS_*`` environment variables of the process (``AWS_ENDPOINT_URL``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ALLOW_HTTP``),
never from the job's YAML or command line. What relies on the store: a PUT with
``If-None-Match: *`` fails where the key exists (S3 and compatible stores honour it), which makes
a deltalake commit and the lock's creation atomic.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from js_etl.delta.rules import local_directory, object_store_url
from js_etl.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow.fs

# The variables that say how to reach an object store, as deltalake and obstore (both the Rust
# object_store client) read them. The driver passes its own on to the tasks
# (:func:`store_options`), whose processes may not have them (a Python worker forked before they
# were set, an executor on another host).
STORE_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                   "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP")


def store_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`STORE_VARIABLES` set in ``environ`` (default: this process's)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in STORE_VARIABLES if env.get(name)}


def table_root(location: str) -> str | None:
    """Where :class:`TableFiles` reaches a table at ``location``: its local directory or its
    object-store URL; None for any other store (Spark's Hadoop file systems only)."""
    return local_directory(location) or object_store_url(location)


# Where the client asks for credentials when the environment has none (EC2's instance metadata).
_INSTANCE_METADATA = "169.254.169.254"


@contextmanager
def _reaching(root: str) -> Iterator[None]:
    """Refused or missing credentials as the configuration error they are (exit 2). Anything
    else the client gives up on (a 5xx past its retries, no answer) stays its error, which
    js_etl.spark.failures.failure_reason reads as transient (exit 75) in one line."""
    from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError

    try:
        yield
    except (PermissionDeniedError, UnauthenticatedError) as e:
        raise ConfigError(f"the object store refused js-etl's credentials for {root} "
                          f"({type(e).__name__}): check AWS_ACCESS_KEY_ID, "
                          "AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN of the drain's process"
                          ) from None
    except GenericError as e:
        if _INSTANCE_METADATA in str(e):  # no credentials in the environment, none from EC2
            raise ConfigError(f"no credentials for the object store of {root}: set "
                              "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
                              "AWS_SESSION_TOKEN) in the drain's environment") from None
        raise


# One client per root and options for the whole process, not one per TableFiles: building a
# client costs milliseconds of CPU (its TLS roots, its credential chain), and a run makes dozens
# of TableFiles for the same two tables (docs/design/object-storage.md). A client holds no table
# state, so sharing it changes nothing a read sees; new options (a rotated token) make a new one.
@lru_cache(maxsize=32)
def _object_store(root: str, options: tuple[tuple[str, str], ...]) -> Any:
    from obstore.store import from_url

    settings = dict(options)
    allow_http = settings.pop("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes")
    config: Any = {k.lower(): v for k, v in settings.items()}  # its keys, lower-cased
    return from_url(root, config=config, client_options={"allow_http": allow_http})


@lru_cache(maxsize=32)
def _arrow_file_system(root: str, options: tuple[tuple[str, str], ...]) -> pyarrow.fs.FileSystem:
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import PyFileSystem

    return PyFileSystem(DeltaStorageHandler(root, dict(options)))


@dataclass(frozen=True)
class TableFiles:
    """Files under a table's root (:func:`table_root`), by paths relative to it; an object store
    is reached with ``options`` (:func:`store_options`; default: this process's)."""

    root: str
    options: Mapping[str, str] | None = field(default=None, repr=False)  # secrets: never shown

    def _options(self) -> dict[str, str]:
        return dict(store_options() if self.options is None else self.options)

    @property
    def remote(self) -> bool:
        return object_store_url(self.root) is not None

    def full(self, path: str) -> str:
        return f"{self.root}/{path}"

    # -- Parquet streams (pyarrow) ------------------------------------------------------------

    @property
    def _arrow(self) -> pyarrow.fs.FileSystem:
        """A pyarrow file system rooted at the table: deltalake's object-store client."""
        return _arrow_file_system(self.root, tuple(sorted(self._options().items())))

    def open_output(self, path: str) -> Any:
        """A new file at ``path``, as a pyarrow output stream (local: parents created)."""
        if self.remote:
            return self._arrow.open_output_stream(path)
        import pyarrow as pa

        full = self.full(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return pa.OSFile(full, "wb")

    def size(self, path: str) -> int:
        if self.remote:
            return int(self._arrow.get_file_info(path).size)
        return os.stat(self.full(path)).st_size

    def parquet_dataset(self, paths: list[str]) -> Any:
        """A pyarrow dataset of the Parquet files at ``paths``."""
        import pyarrow.dataset as ds

        if self.remote:
            return ds.dataset(paths, format="parquet", filesystem=self._arrow)
        return ds.dataset([self.full(p) for p in paths], format="parquet")

    # -- small objects (the log, the lock) ----------------------------------------------------

    @property
    def _store(self) -> Any:
        return _object_store(self.root, tuple(sorted(self._options().items())))

    def names(self, directory: str) -> list[str]:
        """Names directly in ``directory`` ([] where there are none)."""
        if not self.remote:
            full = self.full(directory)
            return os.listdir(full) if os.path.isdir(full) else []
        import obstore

        folder = directory.strip("/")
        with _reaching(self.root):
            listed = obstore.list_with_delimiter(self._store, prefix=folder or None)
        paths = [*listed["common_prefixes"], *(o["path"] for o in listed["objects"])]
        # A store with folders (SeaweedFS) may list the emptied folder itself.
        return sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in paths
                       if p.rstrip("/") != folder})

    def read(self, path: str) -> bytes | None:
        """The bytes at ``path``, None where there is no such file."""
        if not self.remote:
            try:
                with open(self.full(path), "rb") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with _reaching(self.root):
                return bytes(obstore.get(self._store, path).bytes())
        except (NotFoundError, FileNotFoundError):
            return None

    def create(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` only where nothing is: True if written, False if a file
        was there. Atomic: ``O_EXCL`` on a local disk, ``If-None-Match: *`` on a store."""
        if not self.remote:
            full = self.full(path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            try:
                fd = os.open(full, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            with _reaching(self.root):
                obstore.put(self._store, path, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    def replace(self, path: str, data: bytes) -> None:
        """Write ``data`` at ``path``, whatever was there (readers see the old or the new)."""
        if not self.remote:
            full = self.full(path)
            with open(full + ".tmp", "wb") as f:
                f.write(data)
            os.replace(full + ".tmp", full)
            return
        import obstore

        with _reaching(self.root):
            obstore.put(self._store, path, data)

    def remove(self, path: str) -> None:
        """Delete ``path``; nothing where it is gone already."""
        if not self.remote:
            try:
                os.remove(self.full(path))
            except FileNotFoundError:
                pass
            return
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with _reaching(self.root):
                obstore.delete(self._store, path)
        except (NotFoundError, FileNotFoundError):
            pass
