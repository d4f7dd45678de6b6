-- 0019 a new job's job.enqueued pack in its own compact format (storage/packs.py, format 3).
--
-- Every job's first pack holds its job.enqueued event alone, whose fields are all fixed but
-- its data's values. Such a pack is now b'\x03' followed by the JSON array of those values
-- (~23 bytes), not a deflate stream (format 2, ~28 bytes, whose new stream was ~30,000
-- instructions of each enqueue). rq_pack_json(events) returns the same JSON text for it as
-- for the other formats, so the rq_events view, trace windows and gc read it unchanged.
-- Nothing to rewrite: packs written before stay format 2. The migration is the version mark
-- that keeps an older replayq, which cannot read format 3, off a file that may hold it.
SELECT 1;
