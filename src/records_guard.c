/*-------------------------------------------------------------------------
 *
 * records_guard.c
 *	  The idem_records_guard trigger: BEFORE INSERT OR UPDATE FOR EACH ROW
 *	  on idem_records, it holds every change of a record to the state
 *	  machine (state_machine.c), including raw statements by the table
 *	  owner.
 *
 * A record is born processing at attempt 1, succeeded at attempt 1 without
 * a response (idem_inbox), or, when records.c inserts a claim and its
 * outcome as one row (pending_claim.c), in the state of that outcome; a
 * COPY FROM (a restore of a dump) may load any state.  An update never
 * changes a record's scope, key, id or created_at, and every change of its
 * state, attempt or fingerprint is held to idem_check_change.  The trigger
 * finds the columns it reads by name, again after any change to the table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "tcop/cmdtag.h"
#include "tcop/pquery.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/portal.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "records_guard.h"
#include "state_machine.h"

PG_FUNCTION_INFO_V1(idem_records_guard);

/*
 * Set while records.c inserts a claim and its outcome as one row (a new
 * key claimed and finished in one transaction, pending_claim.c): the
 * insert then stands for the insert of attempt 1 and the transition to the
 * outcome, and is allowed when that transition is.  Never set while any
 * other trigger could run: a claim is only kept pending while the guard is
 * the table's only trigger.
 */
static bool finished_insert_allowed = false;

/*
 * Column numbers of idem_records the trigger reads, found again after any
 * change to the table (a column dropped and added again moves, a table
 * dropped and created again may get the same OID back).
 */
typedef struct GuardColumns
{
	Oid			relid;
	AttrNumber	id;
	AttrNumber	scope[5];		/* role, tenant, caller, operation, key */
	AttrNumber	fingerprint;
	AttrNumber	state;
	AttrNumber	attempt;
	AttrNumber	locked_until;
	AttrNumber	attempt_token;
	AttrNumber	response_status;
	AttrNumber	created_at;
	AttrNumber	expires_at;
} GuardColumns;

static GuardColumns columns;
static bool columns_valid = false;
static bool callback_registered = false;

static void find_columns(Relation rel);
static void invalidate_columns(Datum arg pg_attribute_unused(), Oid relid);
static Datum get_column(HeapTuple tuple, TupleDesc tupdesc, AttrNumber attnum,
						bool *isnull);
static bool loading_with_copy(void);
static bool response_empty(HeapTuple tuple, TupleDesc tupdesc);
static bool same_bytes(Datum a, Datum b);
static bool same_scalar(HeapTuple a, HeapTuple b, TupleDesc tupdesc,
						AttrNumber attnum);

/*
 * Allow (or no longer) the next insert to be a claim and its outcome at
 * once; see finished_insert_allowed.
 */
void
idem_guard_allow_finished_insert(bool allow)
{
	finished_insert_allowed = allow;
}

/*
 * BEFORE INSERT OR UPDATE FOR EACH ROW trigger on idem_records.
 */
Datum
idem_records_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const IdemCatalog *cat;
	TupleDesc	tupdesc;
	HeapTuple	newtuple;
	bool		isnull;
	bool		attempt_isnull;
	Datum		state;
	Datum		attempt;
	IdemState	new_state;
	int32		new_attempt;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		elog(ERROR, "idem_records_guard: must be fired before a row is written");

	cat = idem_catalog();
	tupdesc = RelationGetDescr(trigdata->tg_relation);
	if (!columns_valid || columns.relid != RelationGetRelid(trigdata->tg_relation))
		find_columns(trigdata->tg_relation);

	newtuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;
	state = get_column(newtuple, tupdesc, columns.state, &isnull);
	attempt = get_column(newtuple, tupdesc, columns.attempt, &attempt_isnull);
	if (isnull || attempt_isnull)
		return PointerGetDatum(newtuple);	/* NOT NULL constraints report it */
	new_state = idem_state_from_oid(cat, DatumGetObjectId(state));
	new_attempt = DatumGetInt32(attempt);

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
	{
		bool		inbox = new_state == IDEM_SUCCEEDED &&
			response_empty(newtuple, tupdesc);
		bool		finished_at_once = finished_insert_allowed &&
			new_state != IDEM_UNKNOWN &&
			idem_transition_allowed(IDEM_PROCESSING, new_state);

		if (((new_state != IDEM_PROCESSING && !inbox && !finished_at_once) ||
			 new_attempt != 1) &&
			!loading_with_copy())
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("invalid new idempotency record"),
					 errdetail("A record is created in state \"processing\" at attempt 1 (or \"succeeded\" without a response, by idem_inbox), not in state \"%s\" at attempt %d.",
							   idem_state_name(new_state), new_attempt),
					 errhint("Create records with idem_claim() or idem_inbox().")));
		return PointerGetDatum(newtuple);
	}

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		HeapTuple	oldtuple = trigdata->tg_trigtuple;
		IdemChange	change;
		bool		oldnull;
		Datum		locked;
		Datum		fingerprint;
		int			i;

		for (i = 0; i < (int) lengthof(columns.scope); i++)
		{
			Datum		oldval = get_column(oldtuple, tupdesc, columns.scope[i], &oldnull);
			Datum		newval = get_column(newtuple, tupdesc, columns.scope[i], &isnull);
			bool		same;

			/*
			 * role is a regrole from 1.3 on, NULL for a record that belongs
			 * to no role; the other parts (and role before) are texts.
			 */
			if (TupleDescAttr(tupdesc, columns.scope[i] - 1)->attbyval)
				same = same_scalar(oldtuple, newtuple, tupdesc, columns.scope[i]);
			else
				same = !isnull && !oldnull && same_bytes(oldval, newval);
			if (!same)
				ereport(ERROR,
						(errcode(ERRCODE_CHECK_VIOLATION),
						 errmsg("the scope and key of an idempotency record cannot change"),
						 errdetail("Column \"%s\" was changed.",
								   NameStr(TupleDescAttr(tupdesc, columns.scope[i] - 1)->attname))));
		}
		if (!same_scalar(oldtuple, newtuple, tupdesc, columns.id) ||
			!same_scalar(oldtuple, newtuple, tupdesc, columns.created_at))
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("the id and created_at of an idempotency record cannot change")));

		change.old_state =
			idem_state_from_oid(cat,
								DatumGetObjectId(get_column(oldtuple, tupdesc,
															columns.state, &isnull)));
		change.new_state = new_state;
		change.old_attempt = DatumGetInt32(get_column(oldtuple, tupdesc,
													  columns.attempt, &isnull));
		change.new_attempt = new_attempt;
		fingerprint = get_column(newtuple, tupdesc, columns.fingerprint, &isnull);
		if (isnull)
			return PointerGetDatum(newtuple);	/* NOT NULL constraint reports it */
		change.fingerprint_changed =
			!same_bytes(get_column(oldtuple, tupdesc, columns.fingerprint, &oldnull),
						fingerprint);
		change.old_expires_at =
			DatumGetTimestampTz(get_column(oldtuple, tupdesc, columns.expires_at,
										   &isnull));
		locked = get_column(oldtuple, tupdesc, columns.locked_until, &isnull);
		change.old_locked_until = isnull ? DT_NOBEGIN : DatumGetTimestampTz(locked);
		change.now = GetCurrentTimestamp();
		change.new_response_empty = response_empty(newtuple, tupdesc);

		idem_check_change(&change);
	}

	return PointerGetDatum(newtuple);
}

/*
 * Whether a row holds no response status, token or lease: what an inbox
 * record, done at once, looks like.
 */
static bool
response_empty(HeapTuple tuple, TupleDesc tupdesc)
{
	bool		isnull;

	(void) get_column(tuple, tupdesc, columns.response_status, &isnull);
	if (!isnull)
		return false;
	(void) get_column(tuple, tupdesc, columns.attempt_token, &isnull);
	if (!isnull)
		return false;
	(void) get_column(tuple, tupdesc, columns.locked_until, &isnull);
	return isnull;
}

/*
 * Find the column numbers the trigger reads, all of them or none: a column
 * that is missing leaves the previous numbers, marked stale.
 */
static void
find_columns(Relation rel)
{
	TupleDesc	tupdesc = RelationGetDescr(rel);
	GuardColumns found;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_columns, (Datum) 0);
		callback_registered = true;
	}

	found.id = idem_column_number(tupdesc, "id");
	found.scope[0] = idem_column_number(tupdesc, "role");
	found.scope[1] = idem_column_number(tupdesc, "tenant");
	found.scope[2] = idem_column_number(tupdesc, "caller");
	found.scope[3] = idem_column_number(tupdesc, "operation");
	found.scope[4] = idem_column_number(tupdesc, "key");
	found.fingerprint = idem_column_number(tupdesc, "fingerprint");
	found.state = idem_column_number(tupdesc, "state");
	found.attempt = idem_column_number(tupdesc, "attempt");
	found.locked_until = idem_column_number(tupdesc, "locked_until");
	found.attempt_token = idem_column_number(tupdesc, "attempt_token");
	found.response_status = idem_column_number(tupdesc, "response_status");
	found.created_at = idem_column_number(tupdesc, "created_at");
	found.expires_at = idem_column_number(tupdesc, "expires_at");
	found.relid = RelationGetRelid(rel);

	/*
	 * The relation is open and locked, so any invalidation of it has been
	 * processed before the trigger fired, and none arrives while the
	 * numbers are read from its descriptor.
	 */
	columns = found;
	columns_valid = true;
}

/*
 * Relcache callback: the table (or every relation) changed.
 */
static void
invalidate_columns(Datum arg pg_attribute_unused(), Oid relid)
{
	if (!OidIsValid(relid) || relid == columns.relid)
		columns_valid = false;
}

/*
 * Number of a column of idem_records, with a clear error when it is gone.
 */
AttrNumber
idem_column_number(TupleDesc tupdesc, const char *name)
{
	int			attnum = SPI_fnumber(tupdesc, name);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of table \"idem_records\" does not exist", name),
				 errdetail("The idempotency extension needs every column it created.")));
	return (AttrNumber) attnum;
}

static Datum
get_column(HeapTuple tuple, TupleDesc tupdesc, AttrNumber attnum, bool *isnull)
{
	return heap_getattr(tuple, attnum, tupdesc, isnull);
}

/*
 * Whether the row comes from a top-level COPY FROM (a restore of a dump).
 */
static bool
loading_with_copy(void)
{
	return ActivePortal != NULL && ActivePortal->commandTag == CMDTAG_COPY;
}

/*
 * Whether two varlena datums hold the same bytes.
 */
static bool
same_bytes(Datum a, Datum b)
{
	bytea	   *x = DatumGetByteaPP(a);
	bytea	   *y = DatumGetByteaPP(b);

	return VARSIZE_ANY_EXHDR(x) == VARSIZE_ANY_EXHDR(y) &&
		memcmp(VARDATA_ANY(x), VARDATA_ANY(y), VARSIZE_ANY_EXHDR(x)) == 0;
}

/*
 * Whether a by-value column holds the same value (NULL only equals NULL).
 */
static bool
same_scalar(HeapTuple a, HeapTuple b, TupleDesc tupdesc, AttrNumber attnum)
{
	bool		anull;
	bool		bnull;
	Datum		x = get_column(a, tupdesc, attnum, &anull);
	Datum		y = get_column(b, tupdesc, attnum, &bnull);

	return anull == bnull && (anull || x == y);
}
