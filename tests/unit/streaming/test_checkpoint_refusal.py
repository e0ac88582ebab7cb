"""A stream job that finds another run at work on its checkpoint stops with exit 73 in one line,
whichever of Spark's words the race produced (pure logic: the texts are Spark 4.2's)."""

from __future__ import annotations

import pytest

from js_etl.errors import RunRefusedError
from js_etl.streaming.run import _one_line

CHECKPOINT = "/data/checkpoints/orders"


@pytest.mark.parametrize("text", [
    "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs "
    "detected for 0. SQLSTATE: 40000",
    "[STREAM_FAILED] Query [id = 3be7, runId = eb51] terminated with exception: Multiple "
    f"streaming queries are concurrently using file:{CHECKPOINT}/offsets. SQLSTATE: XXKST",
    "org.apache.hadoop.fs.FileAlreadyExistsException: Rename destination "
    f"file:{CHECKPOINT}/commits/3 already exists.",
    "[STREAM_FAILED] Query [id = 3630, runId = e2d8] terminated with exception: "
    f"[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] The checkpoint location file:{CHECKPOINT}/"
    "offsets should be empty on batch 0",
])
def test_another_run_on_the_checkpoint_is_a_refusal(text):
    with pytest.raises(RunRefusedError, match=f"another run .* checkpoint {CHECKPOINT}/:"):
        with _one_line(CHECKPOINT + "/"):
            raise RuntimeError(text)


def test_a_file_conflict_elsewhere_is_not_taken_for_one():
    text = ("org.apache.hadoop.fs.FileAlreadyExistsException: Rename destination "
            "file:/data/tables/orders/_delta_log/00000000000000000003.json already exists.")
    with pytest.raises(RuntimeError, match="_delta_log"):
        with _one_line(CHECKPOINT):
            raise RuntimeError(text)
