"""A checkpoint whose driver was killed while Spark wrote its first offsets (Spark 4.1+ refuses
to start on it), and what ``connectors.spark.checkpoint`` does about it, on real Spark."""

from __future__ import annotations

import time

import pytest

from connectors.spark.checkpoint import clear_unfinished_first_batch, unfinished_first_batch

pytestmark = pytest.mark.integration


def _run_once(spark, checkpoint) -> Exception | None:
    """Start a query on ``checkpoint`` and stop it once batch 0 is committed; its error if it
    ended first."""
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="1 second").start())
    deadline = time.monotonic() + 120
    try:
        while query.isActive and not (checkpoint / "commits" / "0").exists():
            assert time.monotonic() < deadline, "batch 0 was not committed in 120 s"
            time.sleep(0.2)
        return query.exception()
    finally:
        query.stop()


def test_a_first_batch_cut_short_stops_spark_until_its_leftovers_are_cleared(spark, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True)
    # What Spark's rename-based write leaves when its driver dies before the rename.
    leftovers = [offsets / ".0.5f3c.tmp", offsets / "..0.5f3c.tmp.crc"]
    for path in leftovers:
        path.write_bytes(b"v1\n")

    error = _run_once(spark, checkpoint)
    assert error is not None and "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in str(error), error
    assert unfinished_first_batch(str(checkpoint)) == [str(p) for p in sorted(leftovers)]

    assert clear_unfinished_first_batch(f"file://{checkpoint}") == [
        str(p) for p in sorted(leftovers)]
    assert _run_once(spark, checkpoint) is None
    # Past its first batch, the checkpoint is left alone whatever it holds.
    assert (checkpoint / "offsets" / "0").exists()
    (checkpoint / "offsets" / ".1.9a9a.tmp").write_bytes(b"v1\n")
    assert unfinished_first_batch(str(checkpoint)) == []
    assert clear_unfinished_first_batch(str(checkpoint)) == []
    assert (checkpoint / "offsets" / ".1.9a9a.tmp").exists()


def test_a_checkpoint_on_another_store_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"only a local path .* on s3a: remove the hidden files"):
        unfinished_first_batch("s3a://bucket/checkpoints/q1")
    with pytest.raises(ValueError) as refused:
        unfinished_first_batch("s3a://AKIAEXAMPLE:s3cr3t@bucket:9000/checkpoints/q1")
    assert "s3cr3t" not in str(refused.value) and "AKIAEXAMPLE" not in str(refused.value)
    assert "s3a://bucket:9000/checkpoints/q1" in str(refused.value)
