/* idempotency--1.0--1.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

--
-- Version 1.1.  idempotency--1.0.sql is never changed: a new install runs
-- it and then this script, and an installed 1.0 reaches 1.1 through this
-- script alone, so both end with the same objects (sql/upgrade.sql checks
-- that, and that every record survives the update).  Calls written for 1.0
-- keep working unchanged.
--
