-- 0024 gc keeps a ledger day the owner's objects depend on: PostgreSQL only, nothing to do
-- on SQLite.
--
-- On PostgreSQL (its 0024) the function that drops expired ledger day partitions drops
-- each day on its own and keeps, and names, a day whose partition a view (or another
-- object) of the database's owner depends on. SQLite has no ledger partitions (its 0013).
SELECT 1;
