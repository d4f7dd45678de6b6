-- 0027 rq_require, the server-side refusal of a commit sent in one round trip:
-- PostgreSQL only, nothing to do on SQLite.
--
-- SQLite runs in the worker's process: a statement's row count is read before COMMIT at
-- no cost of a round trip, and nothing is pipelined.
SELECT 1;
