-- Questions across jobs by time: the trace in a window of the hybrid logical clock.
-- name: trace_window
-- Production events (each job's own trace, not replays or forks) whose HLC lies in
-- [since_hlc, until_hlc), after the (after_hlc, after_id) cursor, in HLC order: the
-- packs' events (rq_trace) and the job.enqueued events kept in job rows (migration 0023),
-- each by its own index.
SELECT e.*, j.job_type AS job_type, j.handler_version AS version
FROM rq_pack_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id AND j.trace_id = e.trace_id
WHERE e.pack_hlc_last >= :since_hlc AND e.pack_hlc < :until_hlc  -- rq_trace_hlc
  AND e.hlc >= :since_hlc AND e.hlc < :until_hlc
  AND (e.hlc > :after_hlc OR (e.hlc = :after_hlc AND e.id > :after_id))
  AND j.origin = 'production'
  AND (:job_type IS NULL OR j.job_type = :job_type)
  AND (:version IS NULL OR j.handler_version = :version)
  AND (:name IS NULL OR e.name = :name)
  AND (:resource IS NULL
       OR substr(e.resource, 1, length(:resource)) = :resource)
UNION ALL
SELECT e.*, j.job_type AS job_type, j.handler_version AS version
FROM rq_enqueued_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id AND j.trace_id = e.trace_id
WHERE e.pack_hlc_last >= :since_hlc AND e.pack_hlc < :until_hlc  -- rq_jobs_enqueued_hlc
  AND e.hlc >= :since_hlc AND e.hlc < :until_hlc
  AND (e.hlc > :after_hlc OR (e.hlc = :after_hlc AND e.id > :after_id))
  AND j.origin = 'production'
  AND (:job_type IS NULL OR j.job_type = :job_type)
  AND (:version IS NULL OR j.handler_version = :version)
  AND (:name IS NULL OR e.name = :name)
  AND (:resource IS NULL
       OR substr(e.resource, 1, length(:resource)) = :resource)
ORDER BY hlc, id
LIMIT :limit;

-- name: signal_series
-- Signal events per bucket of the HLC's wall-clock part, per job type and version.
SELECT ((e.hlc >> 16) / :bucket_ms) * :bucket_ms AS bucket_ms,
       j.job_type AS job_type, j.handler_version AS version, e.name AS name,
       COUNT(*) AS count
-- rq_pack_events: no signal (replay/signals.py) is a job.enqueued (rq_enqueued_events).
FROM rq_pack_events AS e
JOIN rq_jobs AS j ON j.id = e.job_id AND j.trace_id = e.trace_id
WHERE e.name IN (SELECT value FROM json_each(:names))
  AND j.origin = 'production'
  AND e.pack_hlc_last >= :since_hlc AND e.pack_hlc < :until_hlc  -- rq_trace_hlc
  AND e.hlc >= :since_hlc AND e.hlc < :until_hlc
GROUP BY 1, j.job_type, j.handler_version, e.name
ORDER BY 1, j.job_type, j.handler_version, e.name;
