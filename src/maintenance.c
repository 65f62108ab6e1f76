/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  The two maintenance passes over idem_records, and the SQL functions
 *	  idem_expire_leases() and idem_cleanup() that run them.
 *
 * Lease expiry: processing records whose lease ended (locked_until before
 * the clock, not the transaction start) move to unknown or retryable, as
 * their on_lease_expiry policy says; updated_at becomes the clock and
 * expires_at the clock plus the record's ttl.  Nothing else changes.
 *
 * Cleanup: records in a terminal state (succeeded, failed, retryable) whose
 * expires_at lies more than idempotency.cleanup_grace in the past are
 * deleted.  unknown and processing records are never deleted here.
 *
 * Each pass is one statement that picks at most N rows in index order with
 * FOR UPDATE SKIP LOCKED and changes them:
 *
 *	  ... WHERE id = ANY (ARRAY(SELECT id ... WHERE <conditions>
 *								ORDER BY ... LIMIT $2
 *								FOR UPDATE SKIP LOCKED))
 *
 * A row that a claim holds is skipped instead of waited for.  A row that a
 * claim changed and committed after our snapshot is locked in its newest
 * version and rechecked against the conditions (EvalPlanQual under
 * LockRows) before it is picked, so a record reused meanwhile for a new
 * command is left alone; once picked, the row stays locked by us until the
 * statement's transaction ends, so the outer UPDATE or DELETE changes
 * exactly the version that passed the check.
 *
 * ARRAY(...) rather than IN (...): the sub-select then runs once, as an
 * InitPlan, whatever the statistics say.  With IN, a plan made while the
 * table was empty (the kept generic plan) can be a nested loop that runs
 * the locking sub-select again for every outer row.  The outer WHERE holds
 * nothing but the id list, so the outer scan is a primary key lookup: with
 * the conditions repeated there, the planner may walk the whole expired
 * part of the expiry index for every batch, which makes draining a large
 * backlog quadratic.  The clock and the limit are
 * parameters.  The plans are prepared once per process and kept
 * (SPI_keepplan); they are prepared again when the extension was dropped
 * and created again, or moved to another schema.
 *
 * The background worker runs each batch in a transaction of its own
 * (worker.c).  The SQL functions run inside the caller's transaction: see
 * idem_cleanup() below.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "idempotency.h"
#include "catalog.h"
#include "maintenance.h"

PG_FUNCTION_INFO_V1(idem_expire_leases);
PG_FUNCTION_INFO_V1(idem_cleanup);

/* The kept plans, and the extension and schema they were prepared for. */
static SPIPlanPtr lease_plan = NULL;
static SPIPlanPtr cleanup_plan = NULL;
static Oid	plans_extoid = InvalidOid;
static Oid	plans_nspoid = InvalidOid;

static SPIPlanPtr prepare_kept_plan(const char *query);
static int64 run_batch(SPIPlanPtr plan, TimestampTz cutoff, int limit, int expected);
static int	positive_argument(FunctionCallInfo fcinfo, int argno,
							  const char *name, int setting);

/*
 * The OID of the idempotency extension when it is installed in the current
 * database and its script has finished, else InvalidOid.  Must be called in
 * a transaction.
 *
 * As pg_cron's check does: while CREATE EXTENSION runs in this very
 * backend, the extension's row exists but its objects may not yet.  Other
 * backends do not see the uncommitted row at all.
 */
Oid
idem_installed_extension(void)
{
	Oid			extoid = get_extension_oid(IDEM_EXTENSION_NAME, true);

	if (OidIsValid(extoid) && creating_extension &&
		CurrentExtensionObject == extoid)
		return InvalidOid;

	return extoid;
}

/*
 * Free the kept plans, so that the next idem_maintenance_prepare() builds
 * new ones.  Called when the extension is gone.
 */
void
idem_maintenance_forget(void)
{
	if (lease_plan != NULL)
		SPI_freeplan(lease_plan);
	if (cleanup_plan != NULL)
		SPI_freeplan(cleanup_plan);
	lease_plan = NULL;
	cleanup_plan = NULL;
	plans_extoid = InvalidOid;
	plans_nspoid = InvalidOid;
}

/*
 * Make sure the plans of both passes are prepared for the given installed
 * extension.  Must be called in a transaction, with SPI connected.
 */
void
idem_maintenance_prepare(Oid extoid)
{
	Oid			nspoid = idem_extension_schema(extoid);
	const char *nsp;

	if (lease_plan != NULL && extoid == plans_extoid && nspoid == plans_nspoid)
		return;

	idem_maintenance_forget();

	nsp = quote_identifier(get_namespace_name(nspoid));

	/*
	 * Every operator is schema-qualified: the worker runs as a superuser, so
	 * an operator someone created in a schema on the search_path must never
	 * be picked instead of pg_catalog's.
	 */
	lease_plan = prepare_kept_plan(psprintf(
		"UPDATE %s.idem_records AS r"
		"   SET state = CASE WHEN r.on_lease_expiry OPERATOR(pg_catalog.=)"
		"                         'retry'::%s.idem_lease_policy"
		"               THEN 'retryable'::%s.idem_state"
		"               ELSE 'unknown'::%s.idem_state END,"
		"       updated_at = $1,"
		"       expires_at = $1 OPERATOR(pg_catalog.+) r.ttl"
		" WHERE r.id OPERATOR(pg_catalog.=) ANY (ARRAY("
		"          SELECT l.id FROM %s.idem_records AS l"
		"           WHERE l.state OPERATOR(pg_catalog.=) 'processing'::%s.idem_state"
		"             AND l.locked_until OPERATOR(pg_catalog.<) $1"
		"           ORDER BY l.locked_until"
		"           LIMIT $2"
		"           FOR UPDATE SKIP LOCKED))",
		nsp, nsp, nsp, nsp, nsp, nsp));

	cleanup_plan = prepare_kept_plan(psprintf(
		"DELETE FROM %s.idem_records AS r"
		" WHERE r.id OPERATOR(pg_catalog.=) ANY (ARRAY("
		"          SELECT c.id FROM %s.idem_records AS c"
		"           WHERE c.state OPERATOR(pg_catalog.=) ANY"
		"                 ('{succeeded,failed,retryable}'::%s.idem_state[])"
		"             AND c.expires_at OPERATOR(pg_catalog.<) $1"
		"           ORDER BY c.expires_at"
		"           LIMIT $2"
		"           FOR UPDATE SKIP LOCKED))",
		nsp, nsp, nsp));

	plans_extoid = extoid;
	plans_nspoid = nspoid;
}

/*
 * Prepare a statement taking (timestamptz, integer) and keep its plan for
 * the life of the process.
 */
static SPIPlanPtr
prepare_kept_plan(const char *query)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, INT4OID};
	SPIPlanPtr	plan;

	plan = SPI_prepare(query, 2, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 query, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");

	return plan;
}

/*
 * Run one of the kept plans with its two parameters and return the number
 * of rows it changed.
 */
static int64
run_batch(SPIPlanPtr plan, TimestampTz cutoff, int limit, int expected)
{
	Datum		values[2];
	int			ret;

	values[0] = TimestampTzGetDatum(cutoff);
	values[1] = Int32GetDatum(limit);

	ret = SPI_execute_plan(plan, values, NULL, false, 0);
	if (ret != expected)
		elog(ERROR, "idempotency maintenance statement failed: %s",
			 SPI_result_code_string(ret));

	return (int64) SPI_processed;
}

/*
 * Lease pass: expire at most max_rows leases that ended before now.
 * Must be called with SPI connected and the plans prepared.
 */
int64
idem_expire_leases_batch(int max_rows)
{
	Assert(lease_plan != NULL);
	return run_batch(lease_plan, GetCurrentTimestamp(), max_rows,
					 SPI_OK_UPDATE);
}

/*
 * One cleanup batch: delete at most batch_size terminal records that
 * expired more than idempotency.cleanup_grace ago.  Must be called with SPI
 * connected and the plans prepared.
 */
int64
idem_cleanup_batch(int batch_size)
{
	TimestampTz cutoff;

	Assert(cleanup_plan != NULL);
	cutoff = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										 -((int64) idem_cleanup_grace_s) * 1000);
	return run_batch(cleanup_plan, cutoff, batch_size, SPI_OK_DELETE);
}

/*
 * The value of an optional positive integer argument: the setting when it
 * is NULL, an error when it is zero or negative.
 */
static int
positive_argument(FunctionCallInfo fcinfo, int argno, const char *name,
				  int setting)
{
	int			value;

	if (PG_ARGISNULL(argno))
		return setting;

	value = PG_GETARG_INT32(argno);
	if (value <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", name),
				 errdetail("The value given was %d.", value),
				 errhint("Pass NULL or leave it out to use the server setting.")));
	return value;
}

/*
 * Connect SPI and prepare the plans for the SQL functions below.
 */
static void
connect_and_prepare(void)
{
	Oid			extoid;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	extoid = idem_installed_extension();
	if (!OidIsValid(extoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"%s\" is not installed in this database",
						IDEM_EXTENSION_NAME)));
	idem_maintenance_prepare(extoid);
}

/*
 * idem_expire_leases(max_rows integer DEFAULT NULL) returns bigint
 *
 * The lease pass, once, in the caller's transaction: at most max_rows
 * leases (idempotency.cleanup_batch_size when NULL).  Returns how many
 * records moved to unknown or retryable.
 */
Datum
idem_expire_leases(PG_FUNCTION_ARGS)
{
	int			max_rows = positive_argument(fcinfo, 0, "max_rows",
											 idem_cleanup_batch_size);
	int64		expired;

	connect_and_prepare();
	expired = idem_expire_leases_batch(max_rows);
	SPI_finish();

	PG_RETURN_INT64(expired);
}

/*
 * idem_cleanup(batch_size integer DEFAULT NULL, max_batches integer DEFAULT NULL)
 * returns bigint
 *
 * Cleanup in the caller's transaction: up to max_batches DELETE statements
 * of batch_size rows each (the settings when NULL), stopping at the first
 * batch that finds fewer rows.  A function cannot commit, so every deleted
 * row stays locked until the caller's transaction ends: to drain a large
 * backlog from SQL, call it repeatedly with a small max_batches, each call
 * in its own transaction (as pg_cron does).  Returns how many records were
 * deleted.
 */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	int			batch_size = positive_argument(fcinfo, 0, "batch_size",
											   idem_cleanup_batch_size);
	int			max_batches = positive_argument(fcinfo, 1, "max_batches",
												idem_cleanup_max_batches);
	int64		deleted = 0;
	int			i;

	connect_and_prepare();
	for (i = 0; i < max_batches; i++)
	{
		int64		n = idem_cleanup_batch(batch_size);

		deleted += n;
		if (n < batch_size)
			break;
		CHECK_FOR_INTERRUPTS();
	}
	SPI_finish();

	PG_RETURN_INT64(deleted);
}
