/*-------------------------------------------------------------------------
 *
 * attempt.c
 *	  What the holder of an attempt token does with it (idem_complete,
 *	  idem_fail, idem_heartbeat, idem_checkpoint) and how an operator
 *	  settles a record whose outcome is unknown (idem_resolve).
 *
 * A token write succeeds only while the record is processing the very
 * attempt the token names (records.c puts that in the WHERE clause).  When
 * it does not, the attempt lost its lease to a takeover, already finished or
 * was marked unknown; the write raises 55000 and changes nothing, so a
 * worker that lost its lease never overwrites the outcome of the attempt
 * that replaced it.
 *
 * A token works only for the role that claimed it: a token of another
 * role's record gets the very same error as a token that never existed, so
 * it tells nothing about that record.  idem_resolve settles only the
 * calling role's records, except for operators (the owner of idem_records
 * and superusers), who may settle any.  The statements run as the owner of
 * idem_records (security.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "claim.h"
#include "pending_claim.h"
#include "pg_compat.h"
#include "records.h"
#include "security.h"
#include "stat_operations.h"
#include "token.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_fail);
PG_FUNCTION_INFO_V1(idem_heartbeat);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_resolve);

static void read_token(FunctionCallInfo fcinfo, IdemToken *token);
static void read_response(FunctionCallInfo fcinfo, int status_arg, int body_arg,
						  int headers_arg, int resource_arg, int raw_body_arg,
						  IdemResponse *response);
static void finish_attempt(const IdemToken *token, const IdemResponse *response);
pg_noreturn static void raise_stale_token(const IdemToken *token, Oid userid);

/*
 * idem_complete(token, http_status, body, headers, resource_id, raw_body):
 * the attempt succeeded; its response is stored for replay.  (Version 1.0
 * of the SQL declares no raw_body.)
 */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	IdemToken	token;
	IdemResponse response;

	read_token(fcinfo, &token);
	read_response(fcinfo, 1, 2, 3, 4, 5, &response);
	response.state = IDEM_SUCCEEDED;
	finish_attempt(&token, &response);
	PG_RETURN_VOID();
}

/*
 * idem_fail(token, http_status, body, headers, retryable, raw_body): the attempt
 * failed.  A stable failure (validation error, business conflict) is
 * replayed like a success; a retryable one (nothing happened yet) frees the
 * key for a new attempt with the same request.
 */
Datum
idem_fail(PG_FUNCTION_ARGS)
{
	IdemToken	token;
	IdemResponse response;

	read_token(fcinfo, &token);
	read_response(fcinfo, 1, 2, 3, -1, 5, &response);
	idem_require_arg(fcinfo, 4, "retryable");
	response.state = PG_GETARG_BOOL(4) ? IDEM_RETRYABLE : IDEM_FAILED;
	finish_attempt(&token, &response);
	PG_RETURN_VOID();
}

/*
 * idem_heartbeat(token, lease): the attempt is still running; its lease now
 * ends lease from now.  Returns the new end of the lease.
 */
Datum
idem_heartbeat(PG_FUNCTION_ARGS)
{
	IdemToken	token;
	TimestampTz now = GetCurrentTimestamp();
	int64		lease_usecs;
	TimestampTz locked_until;
	IdemUserContext user;
	bool		ok;

	read_token(fcinfo, &token);
	lease_usecs = PG_ARGISNULL(1) ? (int64) idem_default_lease_ms * 1000 :
		idem_interval_usecs(PG_GETARG_INTERVAL_P(1), "lease", false);
	locked_until = idem_timestamp_plus(now, lease_usecs, "lease");
	idem_require_writable("extend a lease");
	idem_pending_write();

	idem_become_owner(&user);
	ok = idem_record_extend_lease(&token, locked_until, now);
	if (!ok)
		raise_stale_token(&token, user.saved_userid);
	idem_restore_user(&user);
	PG_RETURN_TIMESTAMPTZ(locked_until);
}

/*
 * idem_checkpoint(token, recovery_point): how far the attempt got, so that
 * an attempt taking over after a crash resumes from there.
 */
Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	IdemToken	token;
	text	   *point;
	IdemUserContext user;
	bool		ok;

	read_token(fcinfo, &token);
	idem_require_arg(fcinfo, 1, "recovery_point");
	idem_check_stored_size(PG_GETARG_DATUM(1), "recovery_point");
	point = PG_GETARG_TEXT_PP(1);
	idem_require_writable("record a recovery point");
	idem_pending_write();

	idem_become_owner(&user);
	ok = idem_record_set_recovery_point(&token, point, GetCurrentTimestamp());
	if (!ok)
		raise_stale_token(&token, user.saved_userid);
	idem_restore_user(&user);
	PG_RETURN_VOID();
}

/*
 * idem_resolve(record_id, state, http_status, body, headers, raw_body): an operator
 * who found out what happened settles an unknown record as succeeded,
 * failed or retryable.
 */
Datum
idem_resolve(PG_FUNCTION_ARGS)
{
	int64		id;
	char	   *state;
	IdemResponse response;
	IdemRecord	rec;
	Oid			role;
	bool		any_role;
	IdemUserContext user;
	bool		ok;

	idem_require_arg(fcinfo, 0, "record_id");
	idem_require_arg(fcinfo, 1, "state");
	id = PG_GETARG_INT64(0);
	state = text_to_cstring(PG_GETARG_TEXT_PP(1));
	read_response(fcinfo, 2, 3, 4, -1, 5, &response);
	if (strcmp(state, "succeeded") == 0)
		response.state = IDEM_SUCCEEDED;
	else if (strcmp(state, "failed") == 0)
		response.state = IDEM_FAILED;
	else if (strcmp(state, "retryable") == 0)
		response.state = IDEM_RETRYABLE;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid state \"%s\" for idem_resolve", idem_clip(state, 32)),
				 errhint("An unknown record is resolved as \"succeeded\", \"failed\" or \"retryable\".")));
	idem_require_writable("resolve an idempotency record");
	idem_pending_write();

	/* operators settle any role's records; others only their own */
	role = idem_calling_role();
	any_role = idem_calling_role_is_operator();

	idem_become_owner(&user);
	ok = idem_record_resolve(id, role, any_role, &response, GetCurrentTimestamp());
	if (!ok)
	{
		if (!idem_record_fetch_by_id(id, role, any_role, &rec))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("idempotency record " INT64_FORMAT " does not exist", id)));
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency record " INT64_FORMAT " is not unknown", id),
				 errdetail("Its state is \"%s\"; only unknown records are resolved.",
						   idem_state_name(rec.state))));
	}
	idem_restore_user(&user);
	PG_RETURN_VOID();
}

/*
 * Parse the token of argument 0; it is used by the calling role.
 */
static void
read_token(FunctionCallInfo fcinfo, IdemToken *token)
{
	idem_require_arg(fcinfo, 0, "token");
	idem_token_parse(PG_GETARG_TEXT_PP(0), token);
	token->role = idem_calling_role();
}

/*
 * Read and check a response: status required; a body as JSON or as raw
 * bytes of any content type (not both); headers an object of strings or a
 * list of [name, value] pairs; resource id any text; all of it together
 * within idempotency.max_response_size.  Argument numbers are -1 for what
 * the function does not take; raw_body_arg is ignored when the SQL
 * declaration is 1.0's, which has no raw_body.  The size is checked before
 * the values are detoasted.
 */
static void
read_response(FunctionCallInfo fcinfo, int status_arg, int body_arg,
			  int headers_arg, int resource_arg, int raw_body_arg,
			  IdemResponse *response)
{
	if (raw_body_arg >= PG_NARGS())
		raw_body_arg = -1;
	idem_require_arg(fcinfo, status_arg, "http_status");
	response->http_status = PG_GETARG_INT32(status_arg);
	idem_check_http_status(response->http_status);
	if (!PG_ARGISNULL(body_arg) && raw_body_arg >= 0 && !PG_ARGISNULL(raw_body_arg))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a response has either a body or a raw_body, not both"),
				 errhint("Pass the exact bytes sent to the client as raw_body, or a JSON body as body.")));
	idem_check_response_size(fcinfo, body_arg, headers_arg, resource_arg,
							 raw_body_arg);
	response->body = PG_ARGISNULL(body_arg) ? NULL : PG_GETARG_JSONB_P(body_arg);
	response->raw_body = raw_body_arg < 0 || PG_ARGISNULL(raw_body_arg) ?
		NULL : PG_GETARG_BYTEA_PP(raw_body_arg);
	response->headers = PG_ARGISNULL(headers_arg) ? NULL :
		PG_GETARG_JSONB_P(headers_arg);
	if (response->headers)
		idem_check_headers(response->headers);
	response->resource_id = resource_arg < 0 || PG_ARGISNULL(resource_arg) ?
		NULL : PG_GETARG_TEXT_PP(resource_arg);
}

/*
 * Store the outcome of the attempt the token names, or raise.  The outcome
 * is counted in idem_stat_operations when the transaction commits.
 */
static void
finish_attempt(const IdemToken *token, const IdemResponse *response)
{
	IdemUserContext user;
	bool		ok;
	text	   *operation = NULL;

	idem_require_writable("store the outcome of an attempt");

	idem_become_owner(&user);
	/* a claim of this transaction whose record is not written yet: written finished */
	ok = idem_pending_finish(token, response, &operation) ||
		idem_record_finish(token, response, GetCurrentTimestamp(), &operation);
	if (!ok)
		raise_stale_token(token, user.saved_userid);
	idem_restore_user(&user);
	idem_stat_count_at_commit(user.saved_userid, VARDATA_ANY(operation),
							  VARSIZE_ANY_EXHDR(operation),
							  response->state == IDEM_SUCCEEDED ? IDEM_STAT_COMPLETIONS :
							  response->state == IDEM_RETRYABLE ? IDEM_STAT_RETRYABLE_FAILURES :
							  IDEM_STAT_FAILURES, 1);
}

/*
 * Explain why a token no longer names the record's running attempt, and
 * count it for the calling role (userid) in idem_stat_operations under the
 * record's operation, or the empty operation when the token names no record
 * of the role.  Counted at once: the error aborts the transaction.
 */
static void
raise_stale_token(const IdemToken *token, Oid userid)
{
	IdemRecord	rec;
	char	   *detail;
	const char *hint = NULL;
	bool		found;

	found = idem_record_fetch_by_id(token->record_id, token->role, false, &rec);
	idem_stat_count_now(userid, found ? rec.scope.operation : NULL,
						IDEM_STAT_STALE_TOKENS, 1);
	if (!found)
		detail = psprintf("Record " INT64_FORMAT " no longer exists.",
						  token->record_id);
	else if (rec.attempt != token->attempt)
		detail = psprintf("Attempt %d of record " INT64_FORMAT " was replaced by attempt %d.",
						  token->attempt, token->record_id, rec.attempt);
	else if (rec.state == IDEM_PROCESSING)
		detail = psprintf("The token does not match attempt %d of record " INT64_FORMAT ".",
						  token->attempt, token->record_id);
	else if (rec.state == IDEM_UNKNOWN)
	{
		detail = psprintf("The lease of attempt %d of record " INT64_FORMAT " ended and its outcome was marked unknown.",
						  token->attempt, token->record_id);
		hint = "Once the outcome is known, settle it with idem_resolve().";
	}
	else
		detail = psprintf("Attempt %d of record " INT64_FORMAT " already ended as \"%s\".",
						  token->attempt, token->record_id,
						  idem_state_name(rec.state));

	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("attempt token is no longer valid"),
			 errdetail_internal("%s", detail),
			 hint ? errhint("%s", hint) : 0));
}
