-- A rules table for `[rules] table` (docs/rules.md, "The rules table").
--
-- Created in the first schema of search_path: qualify the name or `SET search_path` first,
-- and name the table in the config as `schema.table` (`[rules] table =
-- "public.wal2delta_rules"`). wal2delta does not create it (`setup` only publishes it
-- when `[source] tables` covers it): it is a table of your application, captured like any
-- other, so a rule changes by a committed change here.
--
-- The primary key is required (Silver keeps one row per key). `version` and `active` may
-- be left out or NULL (1 and true); `version` may also be smallint, bigint or numeric
-- (an integer value). No masking or tokenizing policy may name these columns.
CREATE TABLE IF NOT EXISTS wal2delta_rules (
    -- letters, digits, `_`, `-`, `.`
    id      text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.-]+$'),
    -- the source table, `schema.table` as in PostgreSQL (double-quote a part holding a `.`)
    "table" text NOT NULL,
    -- a DataFusion SQL boolean expression over the table's columns as Silver stores them
    "when"  text NOT NULL,
    version integer NOT NULL DEFAULT 1,
    active  boolean NOT NULL DEFAULT true,
    -- optional: the rule's lookups, `{"NAME": {"table": "schema.table", "on": {"column": "related column"}}}`
    -- (docs/rules.md, "Lookups"); NULL for none
    lookups jsonb
);
