-- PostgreSQL-only plumbing: migration locking and the LISTEN side of wake-ups.

-- name: migrations_lock
-- Two workers starting at once: the second waits here, then finds nothing pending.
-- Keyed on the schema so separate schemas (one per test, one per tenant) do not queue.
SELECT pg_advisory_xact_lock(hashtext('replayq.migrate:' || current_schema()));

-- name: jobs_listen
LISTEN replayq_jobs;

-- name: jobs_listen_installation
-- Which installation's wake-ups this listener wants: its rq_jobs table, as the notifying
-- statements name it (NULL before the schema exists: then every wake-up is heard).
SELECT to_regclass('rq_jobs')::oid::bigint AS installation;

-- name: listen_health
-- The listener's liveness probe: a half-open socket raises nothing until it is used.
SELECT 1;
