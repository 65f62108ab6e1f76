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
 * Cleanup, in two passes over records in a terminal state (succeeded,
 * failed, retryable); unknown and processing records are never touched:
 *
 *	 - cleanup deletes the records whose expires_at lies more than
 *	   idempotency.cleanup_grace plus idempotency.tombstone_ttl in the past;
 *	 - purge turns the records whose expires_at lies more than
 *	   idempotency.cleanup_grace in the past into tombstones: their stored
 *	   response (headers, body, raw body, sealed response, resource id) is
 *	   set to NULL; scope, key, fingerprint, state, status and timestamps
 *	   stay, so that a late retry is answered expired (decision.c) instead
 *	   of running the command again.
 *
 * With idempotency.cleanup_action = 'archive', both passes first copy the
 * full record of every row they change to idem_records_archive, in the same
 * statement (a data-modifying WITH reads the rows before the UPDATE or
 * DELETE changes them).  A record is archived once per command: the copy is
 * skipped when the archive holds one with the same id and claimed_at (a
 * reused record keeps its id but is claimed again), so a record purged and
 * later deleted is archived at the purge, with its response, and a record
 * that never held a response is archived when it is deleted.  The
 * extension never deletes from the archive.  Without the archive table
 * (renamed or moved away, or a table still at 1.0), both passes end with
 * an error instead of changing records that could not be copied; the lease
 * pass goes on.
 *
 * Purge leaves the records past both cutoffs to cleanup, which runs
 * first: when cleanup stops at idempotency.cleanup_max_batches with a
 * backlog left, rewriting that backlog's rows as tombstones just before
 * they are deleted would double the work of draining it.  A record that
 * cleanup cannot delete, because a trigger or a foreign key refuses, is
 * therefore purged by cleanup itself when it skips it (purge_refused()),
 * so that it does not keep its response.  With tombstone_ttl 0 purge
 * does not run and cleanup deletes as version 1.0 did; so it does on a
 * table still at 1.0 (the columns to purge are 1.1's), unless archiving
 * is asked for.  Purge picks its rows through idem_records_unpurged, an
 * index of the records that still hold a response, so that it never walks
 * the tombstones it made; cleanup reads idem_records_expiry from the
 * oldest expiry on, which holds only rows it deletes.
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
 * backlog quadratic.  The clock, the limit and the records to leave out
 * (below) are parameters.  The plans are prepared once per process and
 * kept (SPI_keepplan); they are prepared again when the extension was
 * dropped and created again, moved to another schema or its schema
 * renamed (a kept plan names the schema in its text).
 *
 * A record that cannot be processed (its ttl overflows the clock, a
 * trigger or a foreign key refuses the change) must never stop the pass
 * for the others.  Each batch runs in a subtransaction; when it fails with
 * an error that concerns its rows (not a cancel, a lock timeout or a lack
 * of resources, which are raised again), the subtransaction is rolled
 * back, the batch's rows are locked again and changed one by one, each in
 * a subtransaction of its own.  A row that fails is skipped with a WARNING
 * naming its id and its key's hash prefix (never its key), and its id
 * joins the list the later batches of the same run leave out, so that
 * every batch either changes
 * rows or sets aside new ones: the skipped rows, always first in the
 * index order, can never hold the good ones back.  The next run tries them
 * again.  A row that a trigger keeps without an error (a BEFORE trigger
 * returning NULL) is set aside the same way, found by picking again after
 * a batch that changed fewer rows than its limit and changing those rows
 * one by one (redo_row_by_row()): a row committed after the batch's
 * snapshot is found there too, and is changed, not set aside.  The
 * batch that succeeds, the usual case, costs one subtransaction more than
 * the statement alone.
 *
 * The background worker runs each batch in a transaction of its own
 * (worker.c).  The SQL functions run inside the caller's transaction: see
 * idem_cleanup() below.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "maintenance.h"
#include "pending_claim.h"
#include "record_writer.h"
#include "records.h"
#include "security.h"
#include "stat_operations.h"

PG_FUNCTION_INFO_V1(idem_expire_leases);
PG_FUNCTION_INFO_V1(idem_cleanup);

/* The number of parameters of every maintenance statement. */
#define PASS_NARGS	4
/* columns of the RETURNING list of prepare_pass_plans() */
#define PASS_RETURNING_ID 4
#define PASS_RETURNING_KEPT 5

/*
 * What a statement of a pass did: the rows it changed, and those it wrote
 * but left as due as before (a BEFORE UPDATE trigger returned OLD), which
 * count as kept, not changed.  The ids are in the caller's memory context.
 */
typedef struct PassOutcome
{
	uint64		changed;
	int64	   *changed_ids;
	int64	   *kept;
	int			nkept;
} PassOutcome;

/*
 * The kept plans of one pass, all taking ($1 timestamptz cutoff,
 * $2 integer limit, $3 bigint[] ids, $4 timestamptz cleanup cutoff, which
 * only purge reads):
 *	 batch: change at most $2 rows, leaving out the ids $3
 *	 pick:  lock and return the ids the batch would change
 *	 one:   change the rows whose ids are $3 (picked and locked already)
 */
typedef struct PassPlans
{
	SPIPlanPtr	batch;
	SPIPlanPtr	pick;
	SPIPlanPtr	one;
} PassPlans;

/* What tells the passes apart. */
typedef struct PassDef
{
	const char *name;			/* for messages */
	int			expected;		/* SPI result of batch and one */
} PassDef;

int			idem_cleanup_batch_size = 200;
int			idem_cleanup_max_batches = 500;
int			idem_cleanup_grace_s = 10 * 60;

static const PassDef pass_defs[IDEM_NUM_PASSES] = {
	[IDEM_PASS_LEASES] = {"lease expiry", SPI_OK_UPDATE_RETURNING},
	[IDEM_PASS_CLEANUP] = {"cleanup", SPI_OK_DELETE_RETURNING},
	[IDEM_PASS_PURGE] = {"purge", SPI_OK_UPDATE_RETURNING},
};

/* The kept plans, and the extension and schema they were prepared for. */
static PassPlans plans[IDEM_NUM_PASSES];
static Oid	plans_extoid = InvalidOid;
static Oid	plans_nspoid = InvalidOid;
static char *plans_nspname = NULL;
static bool plans_tombstones = false;	/* table has the 1.1 columns */
static bool plans_archive = false;	/* plans copy rows to the archive */
static bool plans_archive_missing = false;	/* archive wanted, table gone */
static bool plans_former_role = false;	/* both tables have 1.3's column */

static void free_pass_plans(PassPlans *pp);
static void prepare_pass_plans(PassPlans *pp, const char *action,
							   const char *selection, const char *one_ids,
							   const char *kept, const char *archive);
static char *archive_cte(const char *nsp, bool former_role);
static char *holds_response(const char *alias);
static SPIPlanPtr prepare_kept_plan(const char *query);
static TimestampTz pass_cutoff(IdemPass pass, TimestampTz now);
static bool pass_enabled(IdemPass pass);
static Datum ids_array(const int64 *ids, int n);
static void execute_pass_plan(IdemPass pass, SPIPlanPtr plan, Datum *values,
							  PassOutcome *out);
static void count_pass_rows(IdemPass pass);
static bool execute_in_subtransaction(IdemPass pass, SPIPlanPtr plan,
									  Datum *values, PassOutcome *out,
									  ErrorData **edata);
static bool error_concerns_rows(int sqlerrcode);
static bool row_kept(HeapTuple tuple, TupleDesc tupdesc);
static bool id_listed(int64 id, const int64 *list, int n);
static void free_outcome(PassOutcome *out);
static int64 redo_row_by_row(IdemPassRun *run, Datum *values,
							 const PassOutcome *batch, int *picked);
static int64 *pick_ids(IdemPassRun *run, Datum *values, int *n);
static void set_aside(IdemPassRun *run, int64 id, ErrorData *edata,
					  Datum *values);
static bool purge_refused(IdemPassRun *run, int64 id, Datum *values);
static void skip_record(IdemPassRun *run, int64 id, ErrorData *edata,
						bool purged);
static char *record_key(int64 id);
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
 * Free the plans of one pass.
 */
static void
free_pass_plans(PassPlans *pp)
{
	if (pp->batch != NULL)
		SPI_freeplan(pp->batch);
	if (pp->pick != NULL)
		SPI_freeplan(pp->pick);
	if (pp->one != NULL)
		SPI_freeplan(pp->one);
	memset(pp, 0, sizeof(PassPlans));
}

/*
 * Free the kept plans, so that the next idem_maintenance_prepare() builds
 * new ones.  Called when the extension is gone.
 */
void
idem_maintenance_forget(void)
{
	int			i;

	for (i = 0; i < IDEM_NUM_PASSES; i++)
		free_pass_plans(&plans[i]);
	plans_tombstones = false;
	plans_archive = false;
	plans_archive_missing = false;
	plans_former_role = false;
	plans_extoid = InvalidOid;
	plans_nspoid = InvalidOid;
	if (plans_nspname != NULL)
		pfree(plans_nspname);
	plans_nspname = NULL;
}

/*
 * Make sure the plans of both passes are prepared for the given installed
 * extension.  Must be called in a transaction, with SPI connected.
 *
 * The new plans are published only once all of them are prepared: an error
 * half-way (a cancel, say) frees what was built and leaves no plans, so the
 * next call starts again.
 */
void
idem_maintenance_prepare(Oid extoid)
{
	Oid			nspoid = idem_extension_schema(extoid);
	char	   *nspname = get_namespace_name(nspoid);
	PassPlans	built[IDEM_NUM_PASSES];
	const char *nsp;
	bool		tombstones;
	bool		archive;
	bool		archive_missing;
	bool		former_role;
	Oid			tableoid;
	int			i;
	const char *archive_sql = NULL;

	/* ALTER EXTENSION ... UPDATE to 1.1 adds the columns purge clears */
	tableoid = nspname == NULL ? InvalidOid :
		get_relname_relid(IDEM_RECORDS_TABLE, nspoid);
	tombstones = OidIsValid(tableoid) &&
		get_attnum(tableoid, "response_sealed") != InvalidAttrNumber;
	/*
	 * The archive comes with the same update.  When archiving is asked for
	 * and the table is not there (renamed, moved, or not yet made by the
	 * update), the cleanup and purge passes refuse to run (idem_pass_batch)
	 * rather than delete or purge records without their copy; the lease
	 * pass goes on.
	 */
	archive = tombstones && idem_cleanup_action == IDEM_CLEANUP_ARCHIVE &&
		OidIsValid(get_relname_relid(IDEM_ARCHIVE_TABLE, nspoid));
	archive_missing = idem_cleanup_action == IDEM_CLEANUP_ARCHIVE && !archive;
	/*
	 * 1.3 adds former_role and request_text_hash to both: a copy takes them
	 * where both have the first
	 */
	former_role = archive &&
		get_attnum(tableoid, "former_role") != InvalidAttrNumber &&
		get_attnum(get_relname_relid(IDEM_ARCHIVE_TABLE, nspoid),
				   "former_role") != InvalidAttrNumber;
	/* a write Citus would not see is refused before any (catalog.c) */
	if (OidIsValid(tableoid))
		idem_refuse_citus_table(tableoid);

	if (plans[IDEM_PASS_LEASES].batch != NULL && extoid == plans_extoid &&
		nspoid == plans_nspoid && nspname != NULL &&
		strcmp(nspname, plans_nspname) == 0 &&
		tombstones == plans_tombstones && archive == plans_archive &&
		archive_missing == plans_archive_missing &&
		former_role == plans_former_role)
		return;

	idem_maintenance_forget();
	if (nspname == NULL)
		elog(ERROR, "schema %u of extension \"%s\" not found", nspoid,
			 IDEM_EXTENSION_NAME);
	nsp = quote_identifier(nspname);
	memset(built, 0, sizeof(built));
	if (archive)
		archive_sql = archive_cte(nsp, former_role);

	/*
	 * Every operator is schema-qualified: the worker runs as a superuser, so
	 * an operator someone created in a schema on the search_path must never
	 * be picked instead of pg_catalog's.
	 */
	PG_TRY();
	{
		prepare_pass_plans(&built[IDEM_PASS_LEASES],
						   psprintf(
			"UPDATE %s.idem_records AS r"
			"   SET state = CASE WHEN r.on_lease_expiry OPERATOR(pg_catalog.=)"
			"                         'retry'::%s.idem_lease_policy"
			"               THEN 'retryable'::%s.idem_state"
			"               ELSE 'unknown'::%s.idem_state END,"
			"       updated_at = $1,"
			"       expires_at = $1 OPERATOR(pg_catalog.+) r.ttl"
			" WHERE r.id OPERATOR(pg_catalog.=) ANY ",
			nsp, nsp, nsp, nsp),
						   psprintf(
			"SELECT l.id FROM %s.idem_records AS l"
			" WHERE l.state OPERATOR(pg_catalog.=) 'processing'::%s.idem_state"
			"   AND l.locked_until OPERATOR(pg_catalog.<) $1"
			"   AND l.id OPERATOR(pg_catalog.<>) ALL ($3)"
			" ORDER BY l.locked_until"
			" LIMIT $2"
			" FOR UPDATE SKIP LOCKED",
			nsp, nsp), NULL,
						   psprintf("r.state OPERATOR(pg_catalog.=) 'processing'::%s.idem_state",
									nsp),
						   NULL);

		prepare_pass_plans(&built[IDEM_PASS_CLEANUP],
						   psprintf(
			"DELETE FROM %s.idem_records AS r"
			" WHERE r.id OPERATOR(pg_catalog.=) ANY ",
			nsp),
						   psprintf(
			"SELECT c.id FROM %s.idem_records AS c"
			" WHERE c.state OPERATOR(pg_catalog.=) ANY"
			"       ('{succeeded,failed,retryable}'::%s.idem_state[])"
			"   AND c.expires_at OPERATOR(pg_catalog.<) $1"
			"   AND c.id OPERATOR(pg_catalog.<>) ALL ($3)"
			" ORDER BY c.expires_at"
			" LIMIT $2"
			" FOR UPDATE SKIP LOCKED",
			nsp, nsp), NULL, "false", archive_sql);

		/*
		 * The response conditions are those of idem_records_unpurged's
		 * predicate, word for word, so that the planner can use it.
		 * updated_at stays: the tombstone keeps the record's timestamps.
		 * The "one" plan changes only those of the ids $3 that still hold a
		 * response: it also purges the records whose deletion cleanup had
		 * to skip (purge_refused()), and must never rewrite a tombstone.
		 */
		if (tombstones)
			prepare_pass_plans(&built[IDEM_PASS_PURGE],
							   psprintf(
				"UPDATE %s.idem_records AS r"
				"   SET response_headers = NULL, response_body = NULL,"
				"       response_raw_body = NULL, response_sealed = NULL,"
				"       resource_id = NULL"
				" WHERE r.id OPERATOR(pg_catalog.=) ANY ",
				nsp),
							   psprintf(
				"SELECT p.id FROM %s.idem_records AS p"
				" WHERE p.state OPERATOR(pg_catalog.=) ANY"
				"       ('{succeeded,failed,retryable}'::%s.idem_state[])"
				"   AND %s"
				"   AND p.expires_at OPERATOR(pg_catalog.<) $1"
				"   AND p.expires_at OPERATOR(pg_catalog.>=) $4"
				"   AND p.id OPERATOR(pg_catalog.<>) ALL ($3)"
				" ORDER BY p.expires_at"
				" LIMIT $2"
				" FOR UPDATE SKIP LOCKED",
				nsp, nsp, holds_response("p")),
							   psprintf(
				"ARRAY(SELECT o.id FROM %s.idem_records AS o"
				" WHERE o.id OPERATOR(pg_catalog.=) ANY ($3)"
				"   AND %s)",
				nsp, holds_response("o")),
							   holds_response("r"), archive_sql);
	}
	PG_CATCH();
	{
		for (i = 0; i < IDEM_NUM_PASSES; i++)
			free_pass_plans(&built[i]);
		PG_RE_THROW();
	}
	PG_END_TRY();

	memcpy(plans, built, sizeof(plans));
	plans_tombstones = tombstones;
	plans_archive = archive;
	plans_archive_missing = archive_missing;
	plans_former_role = former_role;
	plans_extoid = extoid;
	plans_nspoid = nspoid;
	plans_nspname = MemoryContextStrdup(TopMemoryContext, nspname);
}

/*
 * Prepare the three plans of a pass from its action (an UPDATE or DELETE
 * ending in "WHERE r.id = ANY ") and its selection (the locking SELECT of
 * the ids).  one_ids is the id list of the "one" plan, "$3" when NULL.
 * kept is true of a row the action has written as due as before (a row a
 * BEFORE UPDATE trigger kept by returning OLD).  With archive (the WITH
 * item archive_cte() makes), the ids are picked once, in a WITH item both
 * the copy and the action read.  The
 * plans already prepared stay in *pp when an error ends this half-way, for
 * the caller to free.
 */
static void
prepare_pass_plans(PassPlans *pp, const char *action, const char *selection,
				   const char *one_ids, const char *kept, const char *archive)
{
	/* what count_pass_rows() reads (the state is the new one), the id, kept */
	const char *returning = psprintf(" RETURNING r.role, r.operation, r.state, r.id, %s",
									 kept);

	if (one_ids == NULL)
		one_ids = "$3";

	/*
	 * The cast makes the id list an expression (an InitPlan run once), not
	 * a sub-select ANY would compare every id with.
	 */
	if (archive == NULL)
	{
		pp->batch = prepare_kept_plan(psprintf("%s(ARRAY(%s))%s", action,
											   selection, returning));
		pp->one = prepare_kept_plan(psprintf("%s(%s)%s", action, one_ids,
											 returning));
	}
	else
	{
		pp->batch = prepare_kept_plan(psprintf(
			"WITH ids AS (SELECT ARRAY(%s) AS a), %s %s((SELECT a FROM ids)::pg_catalog.int8[])%s",
			selection, archive, action, returning));
		pp->one = prepare_kept_plan(psprintf(
			"WITH ids AS (SELECT %s AS a), %s %s((SELECT a FROM ids)::pg_catalog.int8[])%s",
			one_ids, archive, action, returning));
	}
	pp->pick = prepare_kept_plan(selection);
}

/*
 * The condition that the record alias holds a response: that of
 * idem_records_unpurged's predicate, word for word.
 */
static char *
holds_response(const char *alias)
{
	return psprintf("(%s.response_headers IS NOT NULL"
					" OR %s.response_body IS NOT NULL"
					" OR %s.response_raw_body IS NOT NULL"
					" OR %s.response_sealed IS NOT NULL"
					" OR %s.resource_id IS NOT NULL)",
					alias, alias, alias, alias, alias);
}

/*
 * The WITH item that copies the records whose ids the item "ids" holds to
 * the archive, unless it holds their command already.  The columns are
 * named: columns of the user's own on idem_records are not archived.
 */
static char *
archive_cte(const char *nsp, bool former_role)
{
	const char *columns = former_role ?
		IDEM_ARCHIVE_COLUMNS_1_3 : IDEM_ARCHIVE_COLUMNS;

	return psprintf(
		"archived AS (INSERT INTO %s.idem_records_archive (%s, archived_at)"
		" SELECT %s, pg_catalog.clock_timestamp() FROM %s.idem_records AS o"
		"  WHERE o.id OPERATOR(pg_catalog.=) ANY ((SELECT a FROM ids)::pg_catalog.int8[])"
		"    AND NOT EXISTS (SELECT FROM %s.idem_records_archive AS x"
		"                     WHERE x.id OPERATOR(pg_catalog.=) o.id"
		"                       AND x.claimed_at OPERATOR(pg_catalog.=) o.claimed_at))",
		nsp, columns, columns, nsp, nsp);
}

/*
 * Prepare a statement taking (timestamptz, integer, bigint[]) and keep its
 * plan for the life of the process.
 */
static SPIPlanPtr
prepare_kept_plan(const char *query)
{
	Oid			argtypes[PASS_NARGS] = {TIMESTAMPTZOID, INT4OID, INT8ARRAYOID,
	TIMESTAMPTZOID};
	SPIPlanPtr	plan;

	plan = SPI_prepare(query, PASS_NARGS, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 query, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");

	return plan;
}

/*
 * Start a run of a pass: one or more batches that share the list of the
 * records they skipped.  The list lives in the current memory context,
 * which must outlast the run's transactions.
 */
void
idem_pass_begin(IdemPassRun *run, IdemPass pass)
{
	memset(run, 0, sizeof(IdemPassRun));
	run->pass = pass;
	run->context = CurrentMemoryContext;
}

/*
 * The clock for the lease pass (not the transaction start: a lease ends
 * when the clock says so), less idempotency.cleanup_grace for purge, and
 * less idempotency.tombstone_ttl besides for cleanup when the table keeps
 * tombstones.
 */
static TimestampTz
pass_cutoff(IdemPass pass, TimestampTz now)
{
	int64		back_s = idem_cleanup_grace_s;

	if (pass == IDEM_PASS_LEASES)
		return now;
	if (pass == IDEM_PASS_CLEANUP && plans_tombstones)
		back_s += idem_tombstone_ttl_s;
	return now - back_s * USECS_PER_SEC;
}

/*
 * Whether a pass has anything to do: purge does not run when tombstones
 * are not kept (tombstone_ttl 0, or a table still at 1.0).
 */
static bool
pass_enabled(IdemPass pass)
{
	if (pass == IDEM_PASS_PURGE)
		return plans_tombstones && idem_tombstone_ttl_s > 0;
	return true;
}

/*
 * A bigint[] of the given ids.
 */
static Datum
ids_array(const int64 *ids, int n)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(n, 1));
	int			i;

	for (i = 0; i < n; i++)
		elems[i] = Int64GetDatum(ids[i]);
	return PointerGetDatum(construct_array(elems, n, INT8OID, sizeof(int64),
										   FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/*
 * One batch of a pass: change at most limit rows, leaving out the records
 * the run skipped so far.  Returns the number of rows changed; *more says
 * whether the batch found limit rows to work on (changed or skipped), so
 * that another batch may find more.  Must be called in a transaction with
 * SPI connected and the plans prepared.
 */
int64
idem_pass_batch(IdemPassRun *run, int limit, bool *more)
{
	const PassDef *def = &pass_defs[run->pass];
	Datum		values[PASS_NARGS];
	PassOutcome out;
	ErrorData  *edata;
	int			picked;
	int64		changed;
	TimestampTz now;

	if (!pass_enabled(run->pass))
	{
		*more = false;
		return 0;
	}
	Assert(plans[run->pass].batch != NULL);
	idem_refuse_write_during_ddl();
	if (run->pass != IDEM_PASS_LEASES && plans_archive_missing)
	{
		if (!plans_tombstones)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency %s cannot archive: the archive needs version 1.1 of extension \"%s\"",
							def->name, IDEM_EXTENSION_NAME),
					 errdetail("idempotency.cleanup_action is \"archive\": no record is deleted without its copy."),
					 errhint("Run ALTER EXTENSION %s UPDATE, or set idempotency.cleanup_action to \"delete\" for this database.",
							 IDEM_EXTENSION_NAME)));
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency %s cannot archive: relation \"%s.%s\" does not exist",
						def->name, plans_nspname, IDEM_ARCHIVE_TABLE),
				 errdetail("idempotency.cleanup_action is \"archive\": no record is purged or deleted without its copy."),
				 errhint("Give the table back its name, or set idempotency.cleanup_action to \"delete\".")));
	}
	now = GetCurrentTimestamp();
	values[0] = TimestampTzGetDatum(pass_cutoff(run->pass, now));
	values[1] = Int32GetDatum(limit);
	values[2] = ids_array(run->skipped, run->nskipped);
	/* purge leaves what cleanup deletes: rewriting it first would be lost work */
	values[3] = TimestampTzGetDatum(pass_cutoff(IDEM_PASS_CLEANUP, now));

	if (execute_in_subtransaction(run->pass, plans[run->pass].batch, values,
								  &out, &edata))
	{
		int			found = (int) out.changed + out.nkept;
		int			i;
		int64		late = 0;

		for (i = 0; i < out.nkept; i++)
			set_aside(run, out.kept[i], NULL, values);

		/*
		 * Fewer rows than the limit: the end of the work, rows that a
		 * trigger kept by returning NULL, which the next batch would pick
		 * first again, or rows that became due after the batch's snapshot.
		 * Look again.
		 */
		picked = 0;
		if (found < limit)
		{
			values[1] = Int32GetDatum(limit - found);
			late = redo_row_by_row(run, values, &out, &picked);
		}
		*more = found >= limit || picked > 0;
		free_outcome(&out);
		return (int64) out.changed + late;
	}

	/* a row of the batch failed: find it, and do the others */
	FreeErrorData(edata);
	changed = redo_row_by_row(run, values, NULL, &picked);
	*more = (picked >= limit);
	return changed;
}

/*
 * Lock the rows of a batch that failed, or that changed fewer rows than
 * its limit, and change them one by one, each in a subtransaction of its
 * own.  The rows are locked in the calling (sub)transaction, so that they
 * stay locked by us whatever happens to the subtransactions.
 *
 * A row whose statement fails is set aside as a skipped record, and so is
 * one that a trigger keeps without an error, by returning NULL (its
 * statement changes nothing) or OLD (it writes the row as it was): later
 * batches go past it instead of picking it first again and changing
 * nothing, which stopped the pass for good once a batch held nothing else.
 * Cleanup purges such records (purge_refused()).  After a short batch
 * (what it did in *batch) the rows found are usually none, at the cost of
 * one more index probe at the end of a pass; a row that became due after
 * the batch's snapshot (committed while it ran) is changed here like any
 * other, not taken for one a trigger kept.  A row the batch changed that
 * is due again (an AFTER trigger undid the change) is set aside and not
 * counted, rather than changed again.  Returns the number of rows changed,
 * less those, and the number of rows picked in *picked.
 */
static int64
redo_row_by_row(IdemPassRun *run, Datum *values, const PassOutcome *batch,
				int *picked)
{
	int64	   *ids;
	int64		changed = 0;
	int			n;
	int			i;

	/* the rows set aside so far, the batch's kept ones among them, stay out */
	values[2] = ids_array(run->skipped, run->nskipped);
	ids = pick_ids(run, values, &n);
	for (i = 0; i < n; i++)
	{
		PassOutcome out;
		ErrorData  *edata;

		CHECK_FOR_INTERRUPTS();
		if (batch != NULL &&
			id_listed(ids[i], batch->changed_ids, (int) batch->changed))
		{
			set_aside(run, ids[i], NULL, values);
			changed--;
			continue;
		}
		values[2] = ids_array(&ids[i], 1);
		if (!execute_in_subtransaction(run->pass, plans[run->pass].one, values,
									   &out, &edata))
			set_aside(run, ids[i], edata, values);
		else
		{
			if (out.changed == 0)
				set_aside(run, ids[i], NULL, values);
			changed += (int64) out.changed;
			free_outcome(&out);
		}
	}

	*picked = n;
	return changed;
}

/*
 * Lock and return the ids the batch with these parameters would change
 * (the pass's "pick" plan), their number in *n.
 */
static int64 *
pick_ids(IdemPassRun *run, Datum *values, int *n)
{
	int64	   *ids;
	int			i;
	int			ret;

	ret = SPI_execute_plan(plans[run->pass].pick, values, NULL, false, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "idempotency maintenance statement failed: %s",
			 SPI_result_code_string(ret));
	*n = (int) SPI_processed;
	ids = palloc(sizeof(int64) * Max(*n, 1));
	for (i = 0; i < *n; i++)
	{
		bool		isnull;

		ids[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
											 SPI_tuptable->tupdesc, 1,
											 &isnull));
	}
	SPI_freetuptable(SPI_tuptable);
	return ids;
}

/*
 * Skip a record the pass could not change (edata, or NULL when its
 * statement left it unchanged without an error); cleanup purges it first
 * (purge_refused()).
 */
static void
set_aside(IdemPassRun *run, int64 id, ErrorData *edata, Datum *values)
{
	skip_record(run, id, edata,
				run->pass == IDEM_PASS_CLEANUP &&
				purge_refused(run, id, values));
}

/*
 * Purge a record whose deletion cleanup had to skip (a trigger or a foreign
 * key refused it), in a subtransaction of its own, when tombstones are
 * kept.  Purge leaves the records past the cleanup cutoff to cleanup, so
 * without this a record that cannot be deleted would keep its response
 * long past its expiry.  The record is still locked by the cleanup run and
 * was picked past the cleanup cutoff, which lies before purge's; the plan
 * leaves a record that holds no response (a tombstone already) alone, so
 * that it is not rewritten at every run.  Returns whether the record is a
 * tombstone now, counting it in run->purged when it just became one; a
 * purge that fails too, or that a trigger keeps, leaves the record as it
 * is.
 */
static bool
purge_refused(IdemPassRun *run, int64 id, Datum *values)
{
	PassOutcome out;
	ErrorData  *edata;

	if (!pass_enabled(IDEM_PASS_PURGE))
		return false;
	Assert(plans[IDEM_PASS_PURGE].one != NULL);
	values[2] = ids_array(&id, 1);
	if (!execute_in_subtransaction(IDEM_PASS_PURGE, plans[IDEM_PASS_PURGE].one,
								   values, &out, &edata))
	{
		FreeErrorData(edata);
		return false;
	}
	run->purged += (int64) out.changed;
	free_outcome(&out);
	return out.nkept == 0;
}

/*
 * Report a record that could not be processed and add it to the run's
 * list of skipped records.  The message names the record by its id and its
 * key's hash prefix, never its key: the error's detail, which may quote the
 * row, is left out, and the key is taken out of the error's message, which
 * a trigger or a constraint of the owner's may have put there.  edata is
 * NULL for a record that its statement left unchanged without an error
 * (redo_row_by_row()).  purged says that cleanup made it a tombstone.
 */
static void
skip_record(IdemPassRun *run, int64 id, ErrorData *edata, bool purged)
{
	const PassDef *def = &pass_defs[run->pass];
	MemoryContext oldcontext;
	char	   *key = record_key(id);
	char	   *message;
	char	   *key_hash;

	if (edata == NULL)
		message = pstrdup("its statement left it unchanged (a trigger may have kept it)");
	else if (key != NULL)
		message = idem_redact_key(edata->message, key);
	else
		message = pstrdup(edata->message);
	key_hash = key != NULL ? idem_key_hash_prefix(key, strlen(key)) :
		pstrdup("-");
	ereport(WARNING,
			(errcode(edata != NULL ? edata->sqlerrcode : ERRCODE_WARNING),
			 errmsg("idempotency %s skipped record %lld (key hash %s): %s",
					def->name, (long long) id, key_hash, message),
			 purged ?
			 errdetail("The record is kept as a tombstone, its response purged, and its deletion tried again by the next pass; the other records are processed.") :
			 errdetail("The record is left as it is and tried again by the next pass; the other records are processed.")));

	oldcontext = MemoryContextSwitchTo(run->context);
	if (run->nskipped >= run->maxskipped)
	{
		run->maxskipped = Max(16, run->maxskipped * 2);
		run->skipped = run->skipped == NULL
			? palloc(sizeof(int64) * run->maxskipped)
			: repalloc(run->skipped, sizeof(int64) * run->maxskipped);
	}
	run->skipped[run->nskipped++] = id;
	if (run->last_skip != NULL)
		pfree(run->last_skip);
	run->last_skip = psprintf("%s skipped record %lld (key hash %s): %s", def->name,
							  (long long) id, key_hash, message);
	MemoryContextSwitchTo(oldcontext);
	if (edata != NULL)
		FreeErrorData(edata);
}

/*
 * The key of a record, or NULL when it is gone.  Only for the rare record a
 * pass skips, so the statement is not kept.  SPI is connected.
 */
static char *
record_key(int64 id)
{
	Oid			argtypes[1] = {INT8OID};
	Datum		values[1];
	char	   *key = NULL;
	int			ret;

	values[0] = Int64GetDatum(id);
	ret = SPI_execute_with_args(psprintf("SELECT key FROM %s.idem_records"
										 " WHERE id OPERATOR(pg_catalog.=) $1",
										 quote_identifier(plans_nspname)),
								1, argtypes, values, NULL, true, 1);
	if (ret == SPI_OK_SELECT && SPI_processed == 1)
		key = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (SPI_tuptable != NULL)
		SPI_freetuptable(SPI_tuptable);
	return key;
}

/*
 * Run a plan of a pass: the rows it changed, counted in
 * idem_stat_operations when the transaction commits, and those it kept
 * (wrote as due as before), not counted, their ids allocated in the
 * current memory context.
 */
static void
execute_pass_plan(IdemPass pass, SPIPlanPtr plan, Datum *values,
				  PassOutcome *out)
{
	int			ret = SPI_execute_plan(plan, values, NULL, false, 0);
	uint64		i;

	if (ret != pass_defs[pass].expected)
		elog(ERROR, "idempotency maintenance statement failed: %s",
			 SPI_result_code_string(ret));
	out->changed = 0;
	out->nkept = 0;
	out->changed_ids = palloc(sizeof(int64) * Max(SPI_processed, 1));
	out->kept = palloc(sizeof(int64) * Max(SPI_processed, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													 SPI_tuptable->tupdesc,
													 PASS_RETURNING_ID,
													 &isnull));

		if (row_kept(SPI_tuptable->vals[i], SPI_tuptable->tupdesc))
			out->kept[out->nkept++] = id;
		else
			out->changed_ids[out->changed++] = id;
	}
	count_pass_rows(pass);
	SPI_freetuptable(SPI_tuptable);
}

/* Free the id lists of a statement's outcome; its counts stay. */
static void
free_outcome(PassOutcome *out)
{
	pfree(out->changed_ids);
	pfree(out->kept);
	out->changed_ids = NULL;
	out->kept = NULL;
}

/* Whether id is one of the n ids of list. */
static bool
id_listed(int64 id, const int64 *list, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (list[i] == id)
			return true;
	return false;
}

/* Whether a row a pass statement returned was kept (written as due as before). */
static bool
row_kept(HeapTuple tuple, TupleDesc tupdesc)
{
	bool		isnull;
	Datum		kept = SPI_getbinval(tuple, tupdesc, PASS_RETURNING_KEPT, &isnull);

	return !isnull && DatumGetBool(kept);
}

/* Rows of a batch with the same role, operation and counter. */
typedef struct PassCount
{
	Oid			role;
	char	   *operation;
	IdemStatCounter counter;
	int64		n;
} PassCount;

#define PASS_COUNT_GROUPS 32

/*
 * Count the rows the statement just run changed (its RETURNING role,
 * operation and, for leases, the new state), per role and operation, when
 * the transaction commits.  A record whose role no longer exists (or that
 * belongs to none) is counted under role 0.
 */
static void
count_pass_rows(IdemPass pass)
{
	PassCount	groups[PASS_COUNT_GROUPS];
	int			ngroups = 0;
	uint64		i;
	int			g;

	if (!idem_stat_enabled() || SPI_tuptable == NULL)
		return;
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	tupdesc = SPI_tuptable->tupdesc;
		bool		role_null;
		Datum		role_value = SPI_getbinval(tuple, tupdesc, 1, &role_null);
		Oid			role = role_null ? InvalidOid : idem_role_column_role(role_value);
		char	   *operation = SPI_getvalue(tuple, tupdesc, 2);
		IdemStatCounter counter;

		if (operation == NULL || row_kept(tuple, tupdesc))
			continue;
		if (pass == IDEM_PASS_LEASES)
		{
			char	   *state = SPI_getvalue(tuple, tupdesc, 3);

			counter = state != NULL && strcmp(state, "retryable") == 0 ?
				IDEM_STAT_LEASES_EXPIRED_RETRYABLE :
				IDEM_STAT_LEASES_EXPIRED_UNKNOWN;
		}
		else
			counter = pass == IDEM_PASS_PURGE ? IDEM_STAT_RECORDS_PURGED :
				IDEM_STAT_RECORDS_DELETED;

		for (g = 0; g < ngroups; g++)
			if (groups[g].counter == counter &&
				groups[g].role == role &&
				strcmp(groups[g].operation, operation) == 0)
				break;
		if (g == ngroups && ngroups == PASS_COUNT_GROUPS)
		{
			/* too many kinds in one batch: count this row alone */
			idem_stat_count_at_commit(role, operation,
									  strlen(operation), counter, 1);
			continue;
		}
		if (g == ngroups)
		{
			groups[g].role = role;
			groups[g].operation = operation;
			groups[g].counter = counter;
			groups[g].n = 0;
			ngroups++;
		}
		groups[g].n++;
	}
	for (g = 0; g < ngroups; g++)
		idem_stat_count_at_commit(groups[g].role,
								  groups[g].operation,
								  strlen(groups[g].operation),
								  groups[g].counter, groups[g].n);
}

/*
 * Run a plan in a subtransaction of its own.  Returns true, with what it
 * did in *out, when it succeeded.  Returns false, with a
 * copy of the error in *edata and the subtransaction rolled back, when it
 * failed with an error that concerns the rows it touched; any other error
 * is raised again.  As PL/pgSQL's exception blocks do.
 */
static bool
execute_in_subtransaction(IdemPass pass, SPIPlanPtr plan, Datum *values,
						  PassOutcome *out, ErrorData **edata)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile bool ok = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		execute_pass_plan(pass, plan, values, out);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		ok = true;
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(oldcontext);
		e = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;

		if (!error_concerns_rows(e->sqlerrcode))
			ReThrowError(e);
		*edata = e;
	}
	PG_END_TRY();

	return ok;
}

/*
 * Whether an error may come from the rows a statement touched (bad data, a
 * constraint, a trigger), so that doing the rows one by one can tell the
 * bad ones from the good.  A cancel, a shutdown, a lock or statement
 * timeout, a deadlock, a missing privilege or object, a lack of memory or
 * disk are no row's fault: they end the pass as they are.
 */
static bool
error_concerns_rows(int sqlerrcode)
{
	switch (ERRCODE_TO_CATEGORY(sqlerrcode))
	{
		case ERRCODE_CONNECTION_EXCEPTION:
		case ERRCODE_TRANSACTION_ROLLBACK:
		case ERRCODE_SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION:
		case ERRCODE_INSUFFICIENT_RESOURCES:
		case ERRCODE_PROGRAM_LIMIT_EXCEEDED:
		case ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE:
		case ERRCODE_OPERATOR_INTERVENTION:
		case ERRCODE_SYSTEM_ERROR:
		case ERRCODE_INTERNAL_ERROR:
			return false;
		default:
			return true;
	}
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
 * records moved to unknown or retryable.  Records that cannot be changed
 * are skipped with a WARNING and do not count against max_rows.
 */
Datum
idem_expire_leases(PG_FUNCTION_ARGS)
{
	int			max_rows = positive_argument(fcinfo, 0, "max_rows",
											 idem_cleanup_batch_size);
	IdemPassRun run;
	int64		expired = 0;
	bool		more = true;

	idem_pending_write();
	idem_pass_begin(&run, IDEM_PASS_LEASES);
	connect_and_prepare();
	while (more && expired < max_rows)
	{
		expired += idem_pass_batch(&run, (int) (max_rows - expired), &more);
		CHECK_FOR_INTERRUPTS();
	}
	SPI_finish();

	PG_RETURN_INT64(expired);
}

/*
 * idem_cleanup(batch_size integer DEFAULT NULL, max_batches integer DEFAULT NULL)
 * returns bigint
 *
 * Cleanup in the caller's transaction: up to max_batches DELETE statements
 * of batch_size rows each (the settings when NULL), stopping at the first
 * batch that finds fewer rows, then as many purge statements in the same
 * way.  A function cannot commit, so every changed row stays locked until
 * the caller's transaction ends: to drain a large backlog from SQL, call it
 * repeatedly with a small max_batches, each call in its own transaction (as
 * pg_cron does).  Returns how many records were deleted or made
 * tombstones; records that cannot be changed are skipped with a WARNING.
 */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	int			batch_size = positive_argument(fcinfo, 0, "batch_size",
											   idem_cleanup_batch_size);
	int			max_batches = positive_argument(fcinfo, 1, "max_batches",
												idem_cleanup_max_batches);
	IdemPass	passes[] = {IDEM_PASS_CLEANUP, IDEM_PASS_PURGE};
	int64		changed = 0;
	int			p;

	idem_pending_write();
	connect_and_prepare();
	for (p = 0; p < (int) lengthof(passes); p++)
	{
		IdemPassRun run;
		bool		more = true;
		int			i;

		idem_pass_begin(&run, passes[p]);
		for (i = 0; i < max_batches && more; i++)
		{
			changed += idem_pass_batch(&run, batch_size, &more);
			CHECK_FOR_INTERRUPTS();
		}
		changed += run.purged;
	}
	SPI_finish();

	PG_RETURN_INT64(changed);
}

/*
 * Define the settings of the cleanup pass: how many records a
 * transaction deletes, how many transactions a run makes, and how long a
 * record stays past its expiry first.  Called from _PG_init on every load.
 */
void
idem_maintenance_init(void)
{
	DefineCustomIntVariable("idempotency.cleanup_batch_size",
							"Expired records deleted per cleanup transaction.",
							NULL,
							&idem_cleanup_batch_size,
							200, 1, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_max_batches",
							"Cleanup transactions per worker cycle.",
							NULL,
							&idem_cleanup_max_batches,
							500, 1, INT_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_grace",
							"Time a record stays past its expiry before cleanup deletes it.",
							NULL,
							&idem_cleanup_grace_s,
							10 * 60, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
}
