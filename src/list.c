/*-------------------------------------------------------------------------
 *
 * list.c
 *	  idem_list(): the calling role's own records in a state, for
 *	  reconciliation jobs that run as the application's role.
 *
 * Like every idem_* function, idem_list runs its statement as the owner of
 * idem_records (security.c) and puts the calling role in the WHERE clause
 * itself: a role sees its own records and never another role's, with no
 * privilege on the table.  The statement is prepared once per backend and
 * kept, and prepared again when the records table was replaced (catalog.c's
 * generation).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "pending_claim.h"
#include "security.h"
#include "validate.h"

#define LIST_COLUMNS	11
#define LIST_NARGS		6
#define LIST_MAX_ROWS	100000

PG_FUNCTION_INFO_V1(idem_list);

static SPIPlanPtr list_plan = NULL;
static uint64 list_plan_generation = 0;

static SPIPlanPtr get_list_plan(const IdemCatalog *cat);

/*
 * idem_list(state, operation, older_than, max_rows) returns setof record:
 * the calling role's records in that state, of that operation if given,
 * whose state last changed at least older_than ago if given (updated_at),
 * at most max_rows of them, the oldest change first.
 */
Datum
idem_list(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	const IdemCatalog *cat;
	char	   *state_name;
	int			state;
	int32		max_rows;
	TimestampTz now = GetCurrentTimestamp();
	Datum		args[LIST_NARGS];
	char		nulls[LIST_NARGS];
	IdemUserContext user;
	int			ret;
	uint64		i;
	bool		wrote_pending;

	idem_require_arg(fcinfo, 0, "state");
	idem_require_arg(fcinfo, 3, "max_rows");
	state_name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	for (state = 0; state < IDEM_NUM_STATES; state++)
		if (strcmp(state_name, idem_state_name((IdemState) state)) == 0)
			break;
	if (state == IDEM_NUM_STATES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid state \"%s\" for idem_list", idem_clip(state_name, 32)),
				 errhint("A state is \"processing\", \"succeeded\", \"failed\", \"retryable\" or \"unknown\".")));
	if (!PG_ARGISNULL(1))
		idem_check_name(PG_GETARG_TEXT_PP(1), "operation", false);
	max_rows = PG_GETARG_INT32(3);
	if (max_rows < 1 || max_rows > LIST_MAX_ROWS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be between 1 and %d", LIST_MAX_ROWS),
				 errdetail("The value given was %d.", max_rows)));

	memset(nulls, ' ', sizeof(nulls));
	cat = idem_catalog();
	args[0] = idem_role_column(idem_calling_role());
	args[1] = ObjectIdGetDatum(cat->state_oids[state]);
	if (PG_ARGISNULL(1))
		nulls[2] = 'n';
	else
		args[2] = PG_GETARG_DATUM(1);
	if (PG_ARGISNULL(2))
		nulls[3] = 'n';
	else
	{
		int64		older_usecs = idem_interval_usecs(PG_GETARG_INTERVAL_P(2),
													  "older_than", true);

		args[3] = TimestampTzGetDatum(now - older_usecs);
	}
	args[4] = TimestampTzGetDatum(now);
	args[5] = Int32GetDatum(max_rows);

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != LIST_COLUMNS)
		elog(ERROR, "idem_list has %d columns, expected %d",
			 rsinfo->setDesc->natts, LIST_COLUMNS);

	/*
	 * A claim of this transaction whose record was just written is seen only
	 * by a snapshot taken after it: the statement's own would miss it.
	 */
	wrote_pending = idem_pending_write();
	idem_become_owner(&user);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute_plan(get_list_plan(cat), args, nulls, !wrote_pending, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "idem_list statement failed: %s", SPI_result_code_string(ret));
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[LIST_COLUMNS];
		bool		isnull[LIST_COLUMNS];
		int			c;

		for (c = 0; c < LIST_COLUMNS; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  c + 1, &isnull[c]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	SPI_finish();
	idem_restore_user(&user);
	return (Datum) 0;
}

/*
 * The kept statement of idem_list, prepared again when the records table
 * changed.  Published only once prepared and kept.
 */
static SPIPlanPtr
get_list_plan(const IdemCatalog *cat)
{
	Oid			types[LIST_NARGS] = {cat->role_is_oid ? OIDOID : TEXTOID,
	cat->state_type, TEXTOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID};
	char	   *sql;
	SPIPlanPtr	plan;

	if (list_plan != NULL && list_plan_generation == cat->generation)
		return list_plan;
	if (list_plan != NULL)
	{
		SPI_freeplan(list_plan);
		list_plan = NULL;
	}
	sql = psprintf("SELECT id, tenant::pg_catalog.text, caller::pg_catalog.text,"
				   " operation::pg_catalog.text, key::pg_catalog.text,"
				   " state::pg_catalog.text, attempt, recovery_point, resource_id,"
				   " $5 OPERATOR(pg_catalog.-) claimed_at,"
				   " $5 OPERATOR(pg_catalog.-) updated_at"
				   " FROM %s"
				   " WHERE role OPERATOR(pg_catalog.=) $1"
				   " AND state OPERATOR(pg_catalog.=) $2"
				   " AND ($3 IS NULL OR operation OPERATOR(pg_catalog.=) $3)"
				   " AND ($4 IS NULL OR updated_at OPERATOR(pg_catalog.<=) $4)"
				   " ORDER BY updated_at, id LIMIT $6",
				   cat->qualified_table);
	plan = SPI_prepare(sql, LIST_NARGS, types);
	if (plan == NULL)
		elog(ERROR, "could not prepare \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "could not keep plan for \"%s\"", sql);
	list_plan = plan;
	list_plan_generation = cat->generation;
	return plan;
}
