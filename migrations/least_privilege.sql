-- The least-privilege capture role for wal2delta, and the publication it reads.
--
-- Run with psql, connected to the source database as a superuser (on RDS the master user,
-- on Cloud SQL a cloudsqlsuperuser) or, for step 3, as the owner of the tables:
--
--   psql "host=... dbname=app user=postgres sslmode=verify-full sslrootcert=..." \
--        -v role=wal2delta -v schema=public -v publication=wal2delta \
--        -f migrations/least_privilege.sql
--
-- then give the role a password without putting it in a file or the shell history:
--   psql ... -c '\password wal2delta'
--
-- Idempotent: run it again after adding tables to the schema. What each step grants and
-- why (docs/security.md, "The least-privilege role"):
--   1. LOGIN and REPLICATION (RDS: membership in rds_replication): the walsender
--      connection and the replication slot. A superuser runs this step.
--   2. CONNECT on the database, USAGE on the schema.
--   3. The publication, FOR TABLE every table of the schema. On PostgreSQL 15 and later
--      only a table's owner (or a superuser) may publish it, so this step runs as the
--      owner; `wal2delta setup` then finds the publication in place and changes nothing.
--   4. SELECT on the published tables only: the initial snapshot and `reconcile` read
--      them; streaming reads no table.
-- The role gets no write privilege, owns nothing, and is not a superuser.

\set ON_ERROR_STOP on
\if :{?role}
\else
  \set role wal2delta
\endif
\if :{?schema}
\else
  \set schema public
\endif
\if :{?publication}
\else
  \set publication wal2delta
\endif

-- 1. The role.
SELECT format('CREATE ROLE %I LOGIN', :'role')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
SELECT CASE
         WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication')
           THEN format('GRANT rds_replication TO %I', :'role')
         ELSE format('ALTER ROLE %I LOGIN REPLICATION', :'role')
       END \gexec

-- 2. Connect to the database, look into the schema.
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'role') \gexec
SELECT format('GRANT USAGE ON SCHEMA %I TO %I', :'schema', :'role') \gexec

-- 3. The publication (as the tables' owner): every ordinary and partitioned table of the
--    schema, partitions published through their root as `wal2delta setup` does.
SELECT format('CREATE PUBLICATION %I FOR TABLE %s WITH (publish_via_partition_root = true)',
              :'publication',
              string_agg(format('%I.%I', n.nspname, c.relname), ', ' ORDER BY c.relname))
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = :'publication')
HAVING count(*) > 0 \gexec
SELECT format('ALTER PUBLICATION %I ADD TABLE %I.%I', :'publication', n.nspname, c.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND EXISTS (SELECT 1 FROM pg_publication WHERE pubname = :'publication')
   AND NOT EXISTS (SELECT 1 FROM pg_publication_rel pr
                    WHERE pr.prpubid = (SELECT oid FROM pg_publication WHERE pubname = :'publication')
                      AND pr.prrelid = c.oid) \gexec

-- 4. SELECT on exactly the published tables.
SELECT format('GRANT SELECT ON %I.%I TO %I', schemaname, tablename, :'role')
  FROM pg_publication_tables WHERE pubname = :'publication' \gexec
