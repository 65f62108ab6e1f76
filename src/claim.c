/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  idem_claim and idem_replay: what a request with an idempotency key
 *	  gets, and the writes that answer needs.
 *
 * A claim reads the record of its scope and key, asks decision.c what to
 * answer, and makes the write that answer needs, if any.  Answers that need
 * no write (replay, mismatch, in_progress, unknown, expired) are read-only:
 * no row lock, no WAL, no key lock.
 *
 * A claim that would create a record takes a token of its role's
 * idempotency.max_new_keys_per_second (rate_limit.c) right before the
 * write (for a new key, once it holds the key lock), and answers rate_limited, writing nothing, when
 * there is none.  If the write then finds the record changed, the token is
 * given back before the claim reads again.  With the limit off this costs
 * one comparison.
 *
 * A claim that inserts a new record holds the key lock (key_lock.c) only
 * until its row is in the unique index.  Inside a transaction block,
 * idem_claim of a new key writes no row yet (pending_claim.c): its
 * completion writes it once, finished, or the commit writes it processing,
 * and the key lock is held until then.  A claim that updates an existing
 * record (takeover, new attempt, reuse) takes a row lock that skips rows
 * locked by others.  No lock-table entry per key is kept until commit, so
 * a transaction may claim any number of keys.  A claim that finds the key
 * being written by another transaction that has not committed (the key
 * lock taken, the new row in the unique index under a dirty snapshot, or
 * the version read updated or locked) answers in_progress at once, or,
 * with wait > 0, waits for that transaction to end (key_lock.c) up to its
 * deadline and then reads again.  Writes are conditional on the version
 * that was read, so a write that finds the record changed writes nothing
 * and the claim reads again.  The loop ends in a bounded number of rounds:
 * only attempts completing, other claims or the worker can change the
 * record, and each of those changes moves it towards a final answer.
 *
 * A claim that waits for an attempt that committed its claim and is still
 * running (the external side effect pattern) has no lock to wait on; it
 * sleeps on its latch in short, growing steps until the record changes, the
 * lease ends or its deadline passes.
 *
 * The scope always includes the calling role (security.c), and the reads
 * and writes run as the owner of idem_records.  On a standby or in a
 * read-only transaction, answers that need no write still work (a claim
 * that replays, idem_replay); a claim that needs a write raises a clear
 * error, except that a lease found ended under policy unknown is answered
 * unknown without marking the record.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "catalog.h"
#include "claim.h"
#include "decision.h"
#include "key_lock.h"
#include "pending_claim.h"
#include "rate_limit.h"
#include "security.h"
#include "stat_operations.h"
#include "token.h"
#include "validate.h"

int			idem_default_ttl_s = 24 * 60 * 60;
int			idem_default_lease_ms = 30 * 1000;
int			idem_claim_wait_ms = 0;

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_claim_text);
PG_FUNCTION_INFO_V1(idem_replay);
PG_FUNCTION_INFO_V1(idem_inbox);
PG_FUNCTION_INFO_V1(idem_claim_many);

/* Rounds of read-decide-write after which a claim answers in_progress. */
#define MAX_WRITE_ROUNDS 5

/* Sleep steps of a claim waiting for a committed attempt, in ms. */
#define WAIT_STEP_MIN_MS 5
#define WAIT_STEP_MAX_MS 100

/* idem_decision's columns: 12 in version 1.0, raw_body added in 1.1 */
#define DECISION_COLUMNS_1_0 12
#define DECISION_COLUMNS 13

/* What a claim or a lookup answers: one idem_decision row. */
typedef struct IdemAnswer
{
	IdemOutcome outcome;
	bool		has_record;
	IdemRecord	rec;
	text	   *token;			/* proceed only */
	bool		has_http_status;
	int32		http_status;
	bool		with_response;	/* replay: stored headers, body, resource */
	const char *error_code;
	bool		has_retry_after;
	int32		retry_after;
} IdemAnswer;

/* What a claim was asked. */
typedef struct ClaimRequest
{
	IdemScope	scope;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	Interval   *ttl;			/* applied as timestamptz + interval */
	int64		lease_usecs;
	int64		wait_usecs;
	IdemLeasePolicy on_lease_expiry;
	bool		proceed_expired;	/* on_expired => 'proceed' */
	bool		inbox;			/* idem_inbox: done at once, no token */
	bool		may_stay_pending;	/* idem_claim: a new key's record may be
									 * written at its completion */
} ClaimRequest;

static void claim_key(const ClaimRequest *req, IdemAnswer *answer);
static text *read_caller(FunctionCallInfo fcinfo, int caller_arg);
static Datum claim_text_fingerprinted(FunctionCallInfo fcinfo,
									  const uint8 *fingerprint);
static void answer_from_record(IdemAnswer *answer, IdemOutcome outcome,
							   const IdemRecord *rec, TimestampTz now);
static void answer_busy(IdemAnswer *answer);
static void answer_rate_limited(IdemAnswer *answer, int32 retry_after);
static bool take_rate_token(const ClaimRequest *req, IdemAction action,
							Oid roleid, IdemAnswer *answer);
static void answer_in_progress_now(const IdemScope *scope,
								   const IdemRecord *rec,
								   IdemAnswer *answer, TimestampTz now);
static void answer_proceed(IdemAnswer *answer, IdemRecord *rec,
						   const IdemAttemptStart *start, int32 attempt,
						   bool with_token);
static void sleep_until(TimestampTz until, int *step_ms);
static void read_scope(FunctionCallInfo fcinfo, int operation_arg, int key_arg,
					   int tenant_arg, int caller_arg, IdemScope *scope);
static Interval *seconds_interval(int seconds);
static HeapTuple answer_tuple(TupleDesc tupdesc, const IdemAnswer *answer);
static void answer_values(const IdemAnswer *answer, Datum *values, bool *nulls);
static void claim_options(FunctionCallInfo fcinfo, int first_arg,
						  ClaimRequest *req);
static Datum *item_array(FunctionCallInfo fcinfo, int argno, const char *name,
						 Oid elemtype, int *nitems);
static bool *repeated_keys(Datum *keys, int nkeys);
static void item_context_callback(void *arg);
static int	key_cmp(Datum a, Datum b);
static int	compare_keys(const void *a, const void *b, void *arg);
static int64 interval_arg(FunctionCallInfo fcinfo, int argno, const char *name,
						  int64 setting_usecs, bool allow_zero);
static void empty_request_fingerprint(uint8 *digest);
static Datum answer_datum(FunctionCallInfo fcinfo, const IdemAnswer *answer);
static void answer_store(FunctionCallInfo fcinfo, const IdemAnswer *answer);
static void check_decision_columns(TupleDesc tupdesc);
static void check_inbox_decision(const ClaimRequest *req, IdemDecision d,
								 const IdemRecord *rec);
static const char *inbox_answer(IdemOutcome outcome);

/*
 * idem_claim(operation, key, request, tenant, caller, ttl, lease, wait,
 *			  on_lease_expiry, on_expired) returns idem_decision
 *
 * Version 1.0 of the SQL declares the first nine arguments only: until
 * ALTER EXTENSION ... UPDATE, a claim of an expired record proceeds as 1.0
 * did (a 1.0 table keeps no tombstones to answer from anyway).
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	ClaimRequest req;
	IdemAnswer	answer;

	read_scope(fcinfo, 0, 1, 3, 4, &req.scope);
	if (PG_ARGISNULL(2))
		empty_request_fingerprint(req.fingerprint);
	else
		idem_fingerprint_jsonb(PG_GETARG_JSONB_P(2), req.fingerprint);
	claim_options(fcinfo, 5, &req);
	req.may_stay_pending = true;

	claim_key(&req, &answer);
	PG_RETURN_DATUM(answer_datum(fcinfo, &answer));
}

/*
 * idem_claim_text(operation, key, request, tenant) returns idem_decision
 * (version 1.2)
 *
 * idem_claim's answer for the same key and request, with every option at
 * its default (the caller the calling role, the settings' ttl, lease and
 * wait, on_lease_expiry 'unknown', on_expired 'reject'), for the SQL that
 * client libraries send on every request: four arguments, and the request
 * as JSON text, fingerprinted from the text without building a jsonb
 * value.  Its fingerprint is the same as the jsonb's, and text that jsonb
 * refuses is refused with the same error, before anything is read or
 * written.
 */
Datum
idem_claim_text(PG_FUNCTION_ARGS)
{
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];

	/*
	 * The request first, as idem_claim's argument is cast before the call,
	 * and in a frame that holds nothing else: PostgreSQL's JSON parser
	 * checks the stack depth at each level, and the claim's own state on
	 * the stack below it would make a text that the cast accepts too deep.
	 */
	if (PG_ARGISNULL(2))
		empty_request_fingerprint(fingerprint);
	else
		idem_fingerprint_json_text(PG_GETARG_TEXT_PP(2), fingerprint);
	return claim_text_fingerprinted(fcinfo, fingerprint);
}

/*
 * The rest of idem_claim_text, once its request is fingerprinted.
 */
static pg_noinline Datum
claim_text_fingerprinted(FunctionCallInfo fcinfo, const uint8 *fingerprint)
{
	ClaimRequest req;
	IdemAnswer	answer;

	memcpy(req.fingerprint, fingerprint, IDEM_FINGERPRINT_LEN);
	read_scope(fcinfo, 0, 1, 3, -1, &req.scope);
	req.ttl = seconds_interval(idem_default_ttl_s);
	(void) idem_interval_usecs(req.ttl, "ttl", false);
	req.lease_usecs = (int64) idem_default_lease_ms * 1000;
	req.wait_usecs = (int64) idem_claim_wait_ms * 1000;
	req.on_lease_expiry = IDEM_POLICY_UNKNOWN;
	req.proceed_expired = false;
	req.inbox = false;
	req.may_stay_pending = true;

	claim_key(&req, &answer);
	PG_RETURN_DATUM(answer_datum(fcinfo, &answer));
}

/*
 * Read the arguments a claim takes after its scope: ttl, lease, wait,
 * on_lease_expiry and (version 1.1) on_expired, from first_arg on.
 */
static void
claim_options(FunctionCallInfo fcinfo, int first_arg, ClaimRequest *req)
{
	req->ttl = PG_ARGISNULL(first_arg) ? seconds_interval(idem_default_ttl_s) :
		PG_GETARG_INTERVAL_P(first_arg);
	(void) idem_interval_usecs(req->ttl, "ttl", false);
	req->lease_usecs = interval_arg(fcinfo, first_arg + 1, "lease",
									(int64) idem_default_lease_ms * 1000, false);
	req->wait_usecs = interval_arg(fcinfo, first_arg + 2, "wait",
								   (int64) idem_claim_wait_ms * 1000, true);
	idem_require_arg(fcinfo, first_arg + 3, "on_lease_expiry");
	req->on_lease_expiry = idem_parse_policy(PG_GETARG_TEXT_PP(first_arg + 3));
	req->proceed_expired = true;
	req->inbox = false;
	req->may_stay_pending = false;
	if (PG_NARGS() > first_arg + 4)
	{
		idem_require_arg(fcinfo, first_arg + 4, "on_expired");
		req->proceed_expired = idem_parse_on_expired(PG_GETARG_TEXT_PP(first_arg + 4));
	}
}

/*
 * idem_claim_many(operation, keys, requests, tenant, caller, ttl, lease,
 *				   wait, on_lease_expiry, on_expired)
 *	  returns setof (key, idem_decision's columns)
 *
 * One claim per element of keys (with the request at the same position of
 * requests, or none when requests is NULL), answered in input order, each
 * exactly as idem_claim would answer it, in the caller's transaction.  The
 * arrays are checked whole before anything is claimed: of different
 * lengths, multidimensional, holding a NULL or an invalid key, they are
 * refused (22023, 22004 ...) and nothing is written.
 *
 * wait bounds the whole call, not each item: an item claimed after the
 * wait ran out answers in_progress at once if it must.  A key repeated
 * within the call is claimed again at each later position without
 * waiting: it reads what its first position left in this transaction, so
 * it answers in_progress when the first proceeded (its record is
 * processing, by this very call), mismatch when the requests differ, and
 * otherwise the first position's answer.
 */
Datum
idem_claim_many(PG_FUNCTION_ARGS)
{
	ClaimRequest req;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *keys;
	Datum	   *requests = NULL;
	bool	   *repeated;
	uint8	   *fingerprints;
	int			nkeys;
	int			i;
	TimestampTz deadline;
	MemoryContext item_context;
	MemoryContext oldcontext;
	ErrorContextCallback item_errcontext;

	idem_require_arg(fcinfo, 0, "operation");
	idem_require_arg(fcinfo, 3, "tenant");
	req.scope.role = idem_calling_role();
	req.scope.operation = PG_GETARG_TEXT_PP(0);
	req.scope.tenant = PG_GETARG_TEXT_PP(3);
	idem_check_name(req.scope.operation, "operation", false);
	idem_check_name(req.scope.tenant, "tenant", true);
	req.scope.caller = read_caller(fcinfo, 4);

	keys = item_array(fcinfo, 1, "keys", TEXTOID, &nkeys);
	if (!PG_ARGISNULL(2))
	{
		int			nrequests;

		requests = item_array(fcinfo, 2, "requests", JSONBOID, &nrequests);
		if (nrequests != nkeys)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("keys and requests must have the same number of elements"),
					 errdetail("keys has %d elements, requests has %d.",
							   nkeys, nrequests)));
	}
	claim_options(fcinfo, 5, &req);

	/* every key and request checked before the first claim writes */
	fingerprints = palloc(Max(nkeys, 1) * IDEM_FINGERPRINT_LEN);
	item_errcontext.callback = item_context_callback;
	item_errcontext.arg = &i;
	item_errcontext.previous = error_context_stack;
	error_context_stack = &item_errcontext;
	for (i = 0; i < nkeys; i++)
	{
		idem_check_key(DatumGetTextPP(keys[i]));
		if (requests)
			idem_fingerprint_jsonb(DatumGetJsonbP(requests[i]),
								   fingerprints + i * IDEM_FINGERPRINT_LEN);
		else
			empty_request_fingerprint(fingerprints + i * IDEM_FINGERPRINT_LEN);
	}
	error_context_stack = item_errcontext.previous;
	repeated = repeated_keys(keys, nkeys);

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != DECISION_COLUMNS + 1)
		elog(ERROR, "idem_claim_many returns %d columns, expected %d",
			 rsinfo->setDesc->natts, DECISION_COLUMNS + 1);

	deadline = idem_timestamp_plus(GetCurrentTimestamp(), req.wait_usecs, "wait");
	item_context = AllocSetContextCreate(CurrentMemoryContext,
										 "idem_claim_many item",
										 ALLOCSET_DEFAULT_SIZES);
	for (i = 0; i < nkeys; i++)
	{
		IdemAnswer	answer;
		Datum		values[DECISION_COLUMNS + 1];
		bool		nulls[DECISION_COLUMNS + 1];

		CHECK_FOR_INTERRUPTS();
		oldcontext = MemoryContextSwitchTo(item_context);
		req.scope.key = DatumGetTextPP(keys[i]);
		memcpy(req.fingerprint, fingerprints + i * IDEM_FINGERPRINT_LEN,
			   IDEM_FINGERPRINT_LEN);
		req.wait_usecs = repeated[i] ? 0 :
			Max(0, deadline - GetCurrentTimestamp());
		claim_key(&req, &answer);

		values[0] = PointerGetDatum(req.scope.key);
		nulls[0] = false;
		answer_values(&answer, values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		MemoryContextSwitchTo(oldcontext);
		MemoryContextReset(item_context);
	}
	MemoryContextDelete(item_context);
	return (Datum) 0;
}

/*
 * Name the item of idem_claim_many whose key or request was refused.
 */
static void
item_context_callback(void *arg)
{
	errcontext("item %d of idem_claim_many", *(int *) arg + 1);
}

/*
 * The elements of a one-dimensional array argument without NULLs: the items
 * of idem_claim_many.  A NULL array is refused like a NULL key.
 */
static Datum *
item_array(FunctionCallInfo fcinfo, int argno, const char *name,
		   Oid elemtype, int *nitems)
{
	ArrayType  *array;
	Datum	   *elems;
	bool	   *nulls;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			i;

	idem_require_arg(fcinfo, argno, name);
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name),
				 errdetail("The array given has %d dimensions.", ARR_NDIM(array))));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(array, elemtype, typlen, typbyval, typalign,
					  &elems, &nulls, nitems);
	for (i = 0; i < *nitems; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not contain NULL", name),
					 errdetail("Element %d is NULL.", i + 1)));
	return elems;
}

/*
 * For each position of keys, whether the same key came at an earlier
 * position: the positions sorted by key, then by position.
 */
static bool *
repeated_keys(Datum *keys, int nkeys)
{
	bool	   *repeated = palloc0(Max(nkeys, 1) * sizeof(bool));
	int		   *order = palloc(Max(nkeys, 1) * sizeof(int));
	int			i;

	for (i = 0; i < nkeys; i++)
		order[i] = i;
	qsort_arg(order, nkeys, sizeof(int), compare_keys, keys);
	for (i = 1; i < nkeys; i++)
		if (key_cmp(keys[order[i - 1]], keys[order[i]]) == 0)
			repeated[order[i]] = true;
	pfree(order);
	return repeated;
}

/*
 * Byte order of two keys (any order does, as long as equal keys meet).
 */
static int
key_cmp(Datum a, Datum b)
{
	text	   *ta = DatumGetTextPP(a);
	text	   *tb = DatumGetTextPP(b);
	int			la = VARSIZE_ANY_EXHDR(ta);
	int			lb = VARSIZE_ANY_EXHDR(tb);
	int			c = memcmp(VARDATA_ANY(ta), VARDATA_ANY(tb), Min(la, lb));

	if (c != 0)
		return c;
	return (la > lb) - (la < lb);
}

/*
 * qsort_arg comparator of positions in keys: by key, then by position.
 */
static int
compare_keys(const void *a, const void *b, void *arg)
{
	Datum	   *keys = (Datum *) arg;
	int			ia = *(const int *) a;
	int			ib = *(const int *) b;
	int			c = key_cmp(keys[ia], keys[ib]);

	if (c != 0)
		return c;
	return (ia > ib) - (ia < ib);
}

/*
 * idem_inbox(consumer, message_id, message, ttl) returns text: whether a
 * consumer applies a message now ('proceed'), already did ('duplicate'),
 * another transaction is applying it right now ('in_progress'), or the id
 * arrived before with a different message ('mismatch').
 *
 * An inbox record is a record of the calling role with operation =
 * consumer, key = message_id, tenant '' and caller = the role, inserted
 * succeeded at once, without token, lease or response, in the consumer's
 * own transaction: an abort forgets it, a commit makes every later call
 * a duplicate.  It goes through the claim's decision and key lock like any
 * claim, so its expiry, tombstone and cleanup are those of every record: a
 * message id seen again past expires_at but within the tombstone window is
 * a duplicate still, or a mismatch for a different message (the tombstone
 * keeps the fingerprint and the fact that it was done); past that window
 * it is new again.  The wait is
 * idempotency.claim_wait.
 */
Datum
idem_inbox(PG_FUNCTION_ARGS)
{
	ClaimRequest req;
	IdemAnswer	answer;

	idem_require_arg(fcinfo, 0, "consumer");
	idem_require_arg(fcinfo, 1, "message_id");
	req.scope.role = idem_calling_role();
	req.scope.operation = PG_GETARG_TEXT_PP(0);
	req.scope.key = PG_GETARG_TEXT_PP(1);
	req.scope.tenant = cstring_to_text("");
	req.scope.caller = idem_scope_caller(NULL);
	idem_check_name(req.scope.operation, "consumer", false);
	idem_check_key(req.scope.key);
	if (PG_ARGISNULL(2))
		empty_request_fingerprint(req.fingerprint);
	else
		idem_fingerprint_jsonb(PG_GETARG_JSONB_P(2), req.fingerprint);
	req.ttl = (PG_NARGS() < 4 || PG_ARGISNULL(3)) ?
		seconds_interval(idem_default_ttl_s) : PG_GETARG_INTERVAL_P(3);
	(void) idem_interval_usecs(req.ttl, "ttl", false);
	req.lease_usecs = 0;
	req.wait_usecs = (int64) idem_claim_wait_ms * 1000;
	req.on_lease_expiry = IDEM_POLICY_UNKNOWN;
	req.proceed_expired = false;
	req.inbox = true;
	req.may_stay_pending = false;

	claim_key(&req, &answer);

	/* a tombstone keeps the fingerprint: a different message is a mismatch */
	if (answer.outcome == IDEM_OUTCOME_EXPIRED &&
		memcmp(answer.rec.fingerprint, req.fingerprint, IDEM_FINGERPRINT_LEN) != 0)
		PG_RETURN_TEXT_P(cstring_to_text("mismatch"));
	PG_RETURN_TEXT_P(cstring_to_text(inbox_answer(answer.outcome)));
}

/*
 * idem_replay(operation, key, tenant, caller) returns setof idem_decision:
 * what a claim would answer, without a request and without writing.  A
 * tombstone (a record past its expiry, within idempotency.tombstone_ttl)
 * shows as expired, from version 1.1 of the SQL on.  No row when there is
 * no record or it is past that.
 */
Datum
idem_replay(PG_FUNCTION_ARGS)
{
	IdemScope	scope;
	IdemRecord	rec;
	IdemAnswer	answer;
	IdemDecision d;
	TimestampTz now = GetCurrentTimestamp();
	IdemUserContext user;
	ReturnSetInfo *rsinfo;
	bool		found;

	read_scope(fcinfo, 0, 1, 2, 3, &scope);
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	idem_pending_write();
	idem_become_owner(&user);
	found = idem_record_fetch(&scope, &rec);
	idem_restore_user(&user);
	if (!found)
		return (Datum) 0;

	/*
	 * Under version 1.0's declaration (a decision of twelve columns) a
	 * record past its expiry shows no row, as in 1.0, in step with
	 * idem_claim, which proceeds there.
	 */
	d = idem_decide(&rec, NULL, now,
					rsinfo->setDesc->natts == DECISION_COLUMNS_1_0);
	if (d.action == IDEM_ACTION_INSERT || d.action == IDEM_ACTION_REUSE)
		return (Datum) 0;
	answer_from_record(&answer, d.outcome, &rec, now);
	answer_store(fcinfo, &answer);
	return (Datum) 0;
}

/*
 * Claim a scope and key: read, decide, write what the decision needs, and
 * fill in the answer.
 *
 * A new record is inserted under the key lock, held only until the row is
 * in the unique index; an existing record is updated with a row lock that
 * skips rows locked by others.  Either write reports, when it finds the key
 * being written by another transaction that has not ended, that
 * transaction: the claim answers in_progress at once, or with time left to
 * wait, waits for that transaction to end and reads again.
 */
static void
claim_key(const ClaimRequest *req, IdemAnswer *answer)
{
	LOCKTAG		lock;
	bool		wrote = false;
	int			rounds = 0;
	int			step_ms = WAIT_STEP_MIN_MS;
	TimestampTz start_time = GetCurrentTimestamp();
	TimestampTz deadline = idem_timestamp_plus(start_time, req->wait_usecs, "wait");
	bool		read_only = RecoveryInProgress() || XactReadOnly;
	Oid			roleid = GetUserId();	/* the caller, before becoming owner */
	bool		took_token = false;
	IdemUserContext user;

	/* this transaction's own pending claim, if any, is read like any */
	idem_pending_write();
	idem_become_owner(&user);

	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		IdemRecord	rec;
		bool		found;
		IdemDecision d;
		IdemAttemptStart start;
		TransactionId writer = InvalidTransactionId;

		CHECK_FOR_INTERRUPTS();
		found = idem_record_fetch(&req->scope, &rec);
		d = idem_decide(found ? &rec : NULL, req->fingerprint, now,
						req->proceed_expired);
		if (req->inbox)
			check_inbox_decision(req, d, &rec);

		if (d.action == IDEM_ACTION_NONE)
		{
			if (d.outcome == IDEM_OUTCOME_IN_PROGRESS && now < deadline)
			{
				if (IsolationUsesXactSnapshot())
				{
					/* this snapshot never sees the attempt end: no sleeping */
					answer_in_progress_now(&req->scope, &rec, answer, now);
					break;
				}
				sleep_until(Min(deadline, rec.locked_until), &step_ms);
				continue;
			}
			answer_from_record(answer, d.outcome, &rec, now);
			break;
		}

		/*
		 * The decision needs a write.  Read-only, an ended lease is still
		 * answered unknown (marking it is the primary's job); anything else
		 * is refused clearly instead of failing in the INSERT or UPDATE.
		 */
		if (read_only)
		{
			if (d.action == IDEM_ACTION_MARK_UNKNOWN)
			{
				rec.state = IDEM_UNKNOWN;
				answer_from_record(answer, IDEM_OUTCOME_UNKNOWN, &rec, now);
				break;
			}
			idem_require_writable("claim an idempotency key");
		}

		if (++rounds > MAX_WRITE_ROUNDS && now >= deadline)
		{
			/* the row keeps being written by others: let the client retry */
			answer_busy(answer);
			break;
		}

		memcpy(start.fingerprint, req->fingerprint, IDEM_FINGERPRINT_LEN);
		start.now = now;
		start.finished = req->inbox;
		if (req->inbox)
		{
			memset(start.secret, 0, IDEM_TOKEN_SECRET_LEN);
			start.locked_until = now;
		}
		else
		{
			idem_token_new_secret(start.secret);
			start.locked_until = idem_timestamp_plus(now, req->lease_usecs, "lease");
		}
		start.expires_at = idem_interval_end(now, req->ttl);
		start.ttl = req->ttl;
		start.on_lease_expiry = req->on_lease_expiry;

		switch (d.action)
		{
			case IDEM_ACTION_INSERT:

				/*
				 * Own the key until the row is in the unique index.  Whoever
				 * holds the lock now is inserting the same key, or holds a
				 * pending claim of it, and has not committed.
				 */
				idem_key_lock_tag(&lock, &req->scope);
				if (!idem_key_lock_try(&lock))
				{
					if (now < deadline &&
						idem_key_lock_wait(&lock,
										   (int) Min(Max(1, (deadline - now) / 1000),
													 PG_INT32_MAX)))
						continue;	/* read what the other insert left */
					answer_busy(answer);
					goto done;
				}
				if (!take_rate_token(req, d.action, roleid, answer))
				{
					idem_key_lock_release(&lock);
					goto done;
				}
				took_token = idem_max_new_keys_per_second > 0 && !req->inbox;
				memset(&rec, 0, sizeof(rec));
				/* an error on the way gives the lock back with the abort */
				wrote = idem_pending_claim_new(&req->scope, &start,
											   req->may_stay_pending, &lock,
											   &rec.id, &writer);
				if (wrote)
					answer_proceed(answer, &rec, &start, 1, !req->inbox);
				break;
			case IDEM_ACTION_REUSE:
			case IDEM_ACTION_TAKEOVER:
			case IDEM_ACTION_NEW_ATTEMPT:
				{
					bool		reuse = d.action == IDEM_ACTION_REUSE;
					int32		attempt;

					if (!reuse && rec.attempt == PG_INT32_MAX)
						ereport(ERROR,
								(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
								 errmsg("the idempotency record has reached the largest attempt number"),
								 errdetail("Attempt %d was its last; no further attempt can start.",
										   rec.attempt),
								 errhint("The owner of idem_records can delete the record to start the command over.")));
					attempt = reuse ? 1 : rec.attempt + 1;
					if (!take_rate_token(req, d.action, roleid, answer))
						goto done;
					took_token = reuse && idem_max_new_keys_per_second > 0 &&
						!req->inbox;

					wrote = idem_record_restart(&rec, reuse, &start);
					if (wrote)
						answer_proceed(answer, &rec, &start, attempt,
									   !req->inbox);
				}
				break;
			case IDEM_ACTION_MARK_UNKNOWN:
				wrote = idem_record_mark_unknown(&rec, now);
				if (wrote)
				{
					idem_stat_count_at_commit(user.saved_userid,
											  VARDATA_ANY(req->scope.operation),
											  VARSIZE_ANY_EXHDR(req->scope.operation),
											  IDEM_STAT_LEASES_EXPIRED_UNKNOWN, 1);
					rec.state = IDEM_UNKNOWN;
					answer_from_record(answer, IDEM_OUTCOME_UNKNOWN, &rec, now);
				}
				break;
			case IDEM_ACTION_NONE:
				pg_unreachable();
		}
		if (wrote)
			break;
		if (took_token)
		{
			/* no record created: the next round decides again */
			idem_rate_limit_give_back(MyDatabaseId, roleid);
			took_token = false;
		}

		/*
		 * The record changed since it was read, or another transaction is
		 * writing it: inserting the same key, or updating, locking or
		 * deleting the version that was read (a completion racing this
		 * takeover, the worker, say).  A transaction that is still running
		 * is what the claim answers in_progress for, at once, or waits for
		 * with time left; one that ended left a record to read again.
		 */
		if (!TransactionIdIsValid(writer) && found)
			writer = rec.writer_xid;
		if (TransactionIdIsValid(writer) && !TransactionIdIsInProgress(writer))
			writer = InvalidTransactionId;
		now = GetCurrentTimestamp();
		if (now >= deadline)
		{
			if (TransactionIdIsValid(writer))
			{
				answer_busy(answer);
				break;
			}
			continue;
		}
		if (TransactionIdIsValid(writer))
			(void) idem_xact_wait(writer,
								  (int) Min(Max(1, (deadline - now) / 1000),
											PG_INT32_MAX));
		else
			sleep_until(deadline, &step_ms);
	}

done:
	idem_restore_user(&user);
	/* every answer of idem_claim, idem_claim_many and idem_inbox counts */
	if (idem_stat_enabled())
		idem_stat_count_claim(roleid, req->scope.operation, answer->outcome,
							  GetCurrentTimestamp() - start_time);
}

/*
 * A claim about to create a record (a new key, or a new command on an
 * expired record) spends a token of its role's
 * idempotency.max_new_keys_per_second, right before the write; without one
 * it answers rate_limited and writes nothing.  Other writes are not
 * limited, nor is idem_inbox: a consumer's message ids come from its own
 * queue, whose pace the consumer sets, not from a client's retries.  With
 * the limit off this costs one comparison.
 */
static bool
take_rate_token(const ClaimRequest *req, IdemAction action, Oid roleid,
				IdemAnswer *answer)
{
	int32		retry_after;

	if (idem_max_new_keys_per_second <= 0 || req->inbox ||
		!idem_action_creates_record(action))
		return true;
	if (idem_rate_limit_take(MyDatabaseId, roleid, &retry_after))
		return true;
	answer_rate_limited(answer, retry_after);
	return false;
}

/*
 * Fill in an answer that comes from a record as it is.
 */
static void
answer_from_record(IdemAnswer *answer, IdemOutcome outcome,
				   const IdemRecord *rec, TimestampTz now)
{
	memset(answer, 0, sizeof(*answer));
	answer->outcome = outcome;
	answer->has_record = true;
	answer->rec = *rec;

	switch (outcome)
	{
		case IDEM_OUTCOME_REPLAY:
			answer->has_http_status = rec->has_response_status;
			answer->http_status = rec->response_status;
			answer->with_response = true;
			idem_record_open_response(&answer->rec);
			break;
		case IDEM_OUTCOME_IN_PROGRESS:
			answer->has_http_status = true;
			answer->http_status = 409;
			answer->error_code = "IDEMPOTENCY_REQUEST_IN_PROGRESS";
			answer->has_retry_after = true;
			answer->retry_after = 1;
			if (rec->has_lease && rec->locked_until > now)
				answer->retry_after =
					(int32) Min((rec->locked_until - now + USECS_PER_SEC - 1) / USECS_PER_SEC,
								PG_INT32_MAX);
			break;
		case IDEM_OUTCOME_MISMATCH:
			answer->has_http_status = true;
			answer->http_status = 422;
			answer->error_code = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST";
			break;
		case IDEM_OUTCOME_UNKNOWN:
			answer->has_http_status = true;
			answer->http_status = 409;
			answer->error_code = "IDEMPOTENCY_OUTCOME_UNKNOWN";
			break;
		case IDEM_OUTCOME_EXPIRED:
			/* the response may be purged already: none is ever returned */
			answer->has_http_status = true;
			answer->http_status = 409;
			answer->error_code = "IDEMPOTENCY_KEY_EXPIRED";
			break;
		case IDEM_OUTCOME_PROCEED:
			/* a lookup (idem_replay) of a key a claim would proceed with */
			break;
		case IDEM_OUTCOME_RATE_LIMITED:
			/* never from a record: answer_rate_limited */
			elog(ERROR, "rate_limited is not answered from a record");
			break;
	}
}

/*
 * Answer a claim that would wait for a running attempt, under REPEATABLE
 * READ or SERIALIZABLE, at once.  Its snapshot shows the record as it was
 * when the transaction began, so waiting would only sleep out the deadline
 * and then answer from a lease that may be long over.  If the record has
 * changed since (completed, failed, taken over), retrying the transaction
 * will see the answer: a serialization failure says so.  Otherwise the
 * attempt is still running: in_progress, with retry_after 1, as the claim
 * that asked to wait could not.
 */
static void
answer_in_progress_now(const IdemScope *scope, const IdemRecord *rec,
					   IdemAnswer *answer, TimestampTz now)
{
	IdemRecord	latest;

	if (!idem_record_fetch_latest(scope, &latest) ||
		latest.id != rec->id || latest.state != rec->state ||
		latest.attempt != rec->attempt ||
		latest.has_lease != rec->has_lease ||
		(rec->has_lease && latest.locked_until != rec->locked_until))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("The idempotency record changed after this transaction's snapshot was taken."),
				 errhint("Retry the transaction: it will see the record's answer.")));
	answer_from_record(answer, IDEM_OUTCOME_IN_PROGRESS, rec, now);
	answer->retry_after = 1;
}

/*
 * Fill in in_progress for a key another transaction is writing right now:
 * its record is not visible yet.
 */
static void
answer_busy(IdemAnswer *answer)
{
	memset(answer, 0, sizeof(*answer));
	answer->outcome = IDEM_OUTCOME_IN_PROGRESS;
	answer->has_http_status = true;
	answer->http_status = 409;
	answer->error_code = "IDEMPOTENCY_REQUEST_IN_PROGRESS";
	answer->has_retry_after = true;
	answer->retry_after = 1;
}

/*
 * Fill in rate_limited for a claim that would create a record beyond its
 * role's idempotency.max_new_keys_per_second.  There is no record: the
 * claim wrote nothing.
 */
static void
answer_rate_limited(IdemAnswer *answer, int32 retry_after)
{
	memset(answer, 0, sizeof(*answer));
	answer->outcome = IDEM_OUTCOME_RATE_LIMITED;
	answer->has_http_status = true;
	answer->http_status = 429;
	answer->error_code = "IDEMPOTENCY_RATE_LIMITED";
	answer->has_retry_after = true;
	answer->retry_after = retry_after;
}

/*
 * Fill in proceed for the attempt just written.
 */
static void
answer_proceed(IdemAnswer *answer, IdemRecord *rec,
			   const IdemAttemptStart *start, int32 attempt, bool with_token)
{
	IdemToken	token;

	memset(answer, 0, sizeof(*answer));
	answer->outcome = IDEM_OUTCOME_PROCEED;
	answer->has_record = true;
	answer->rec.id = rec->id;
	answer->rec.state = IDEM_PROCESSING;
	answer->rec.attempt = attempt;
	answer->rec.recovery_point = rec->recovery_point;
	if (!with_token)
		return;

	token.record_id = rec->id;
	token.attempt = attempt;
	memcpy(token.secret, start->secret, IDEM_TOKEN_SECRET_LEN);
	answer->token = idem_token_format(&token);
}

/*
 * Sleep on the latch for the next step, but not past until.
 */
static void
sleep_until(TimestampTz until, int *step_ms)
{
	long		remaining_ms = (until - GetCurrentTimestamp()) / 1000;
	long		ms = Max(1, Min(*step_ms, remaining_ms));

	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	*step_ms = Min(*step_ms * 2, WAIT_STEP_MAX_MS);
}

/*
 * Read and check the scope and key from the given arguments; caller_arg -1
 * means the calling role itself (a function without a caller argument).
 */
static void
read_scope(FunctionCallInfo fcinfo, int operation_arg, int key_arg,
		   int tenant_arg, int caller_arg, IdemScope *scope)
{
	idem_require_arg(fcinfo, operation_arg, "operation");
	idem_require_arg(fcinfo, key_arg, "key");
	idem_require_arg(fcinfo, tenant_arg, "tenant");
	scope->role = idem_calling_role();
	scope->operation = PG_GETARG_TEXT_PP(operation_arg);
	scope->key = PG_GETARG_TEXT_PP(key_arg);
	scope->tenant = PG_GETARG_TEXT_PP(tenant_arg);
	idem_check_name(scope->operation, "operation", false);
	idem_check_key(scope->key);
	idem_check_name(scope->tenant, "tenant", true);
	scope->caller = caller_arg >= 0 ? read_caller(fcinfo, caller_arg) :
		idem_scope_caller(NULL);
}

/*
 * The caller a call's scope stores, from its caller argument: from 1.3 on
 * NULL (the argument's default) is the role itself; before, the default
 * was current_user and NULL is refused as any other NULL argument.
 */
static text *
read_caller(FunctionCallInfo fcinfo, int caller_arg)
{
	text	   *caller;

	if (PG_ARGISNULL(caller_arg) && idem_catalog()->role_is_oid)
		return idem_scope_caller(NULL);
	idem_require_arg(fcinfo, caller_arg, "caller");
	caller = PG_GETARG_TEXT_PP(caller_arg);
	idem_check_name(caller, "caller", false);
	return idem_scope_caller(caller);
}

/*
 * An interval of whole seconds.
 */
static Interval *
seconds_interval(int seconds)
{
	Interval   *result = palloc0(sizeof(Interval));

	result->time = (int64) seconds * USECS_PER_SEC;
	return result;
}

/*
 * An interval argument in microseconds; NULL means the setting.
 */
static int64
interval_arg(FunctionCallInfo fcinfo, int argno, const char *name,
			 int64 setting_usecs, bool allow_zero)
{
	if (PG_ARGISNULL(argno))
		return setting_usecs;
	return idem_interval_usecs(PG_GETARG_INTERVAL_P(argno), name, allow_zero);
}

/*
 * Fingerprint of a claim without a request: SHA-256 of the empty string,
 * which no JSON value's canonical form equals.
 */
static void
empty_request_fingerprint(uint8 *digest)
{
	static const uint8 empty_sha256[IDEM_FINGERPRINT_LEN] = {
		0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14,
		0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
		0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c,
		0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55
	};

	memcpy(digest, empty_sha256, IDEM_FINGERPRINT_LEN);
}

/*
 * The answer as an idem_decision row.
 */
static HeapTuple
answer_tuple(TupleDesc tupdesc, const IdemAnswer *answer)
{
	Datum		values[DECISION_COLUMNS];
	bool		nulls[DECISION_COLUMNS];

	answer_values(answer, values, nulls);
	return heap_form_tuple(tupdesc, values, nulls);
}

/*
 * The answer as the DECISION_COLUMNS values of an idem_decision row.
 */
static void
answer_values(const IdemAnswer *answer, Datum *values, bool *nulls)
{
	const IdemCatalog *cat = idem_catalog();
	const IdemRecord *rec = &answer->rec;

	memset(nulls, true, DECISION_COLUMNS * sizeof(bool));
	values[0] = CStringGetTextDatum(idem_outcome_name(answer->outcome));
	nulls[0] = false;
	if (answer->token)
	{
		values[1] = PointerGetDatum(answer->token);
		nulls[1] = false;
	}
	if (answer->has_record)
	{
		values[2] = Int64GetDatum(rec->id);
		values[3] = ObjectIdGetDatum(cat->state_oids[rec->state]);
		values[4] = Int32GetDatum(rec->attempt);
		nulls[2] = nulls[3] = nulls[4] = false;
		if (rec->recovery_point)
		{
			values[5] = PointerGetDatum(rec->recovery_point);
			nulls[5] = false;
		}
	}
	if (answer->has_http_status)
	{
		values[6] = Int32GetDatum(answer->http_status);
		nulls[6] = false;
	}
	if (answer->with_response)
	{
		if (rec->response_headers)
		{
			values[7] = JsonbPGetDatum(rec->response_headers);
			nulls[7] = false;
		}
		if (rec->response_body)
		{
			values[8] = JsonbPGetDatum(rec->response_body);
			nulls[8] = false;
		}
		if (rec->resource_id)
		{
			values[11] = PointerGetDatum(rec->resource_id);
			nulls[11] = false;
		}
		if (rec->response_raw_body)
		{
			values[12] = PointerGetDatum(rec->response_raw_body);
			nulls[12] = false;
		}
	}
	if (answer->error_code)
	{
		values[9] = CStringGetTextDatum(answer->error_code);
		nulls[9] = false;
	}
	if (answer->has_retry_after)
	{
		values[10] = Int32GetDatum(answer->retry_after);
		nulls[10] = false;
	}
}

/*
 * The row type is idem_decision as version 1.0 or 1.1 of the SQL declares
 * it: the library serves both, so that a server keeps answering between
 * installing a new library and ALTER EXTENSION ... UPDATE.
 */
static void
check_decision_columns(TupleDesc tupdesc)
{
	if (tupdesc->natts != DECISION_COLUMNS &&
		tupdesc->natts != DECISION_COLUMNS_1_0)
		elog(ERROR, "idem_decision has %d columns, expected %d",
			 tupdesc->natts, DECISION_COLUMNS);
}

/*
 * The answer as the composite result of a function returning idem_decision.
 */
static Datum
answer_datum(FunctionCallInfo fcinfo, const IdemAnswer *answer)
{
	Oid			rettype = get_fn_expr_rettype(fcinfo->flinfo);
	TupleDesc	tupdesc;
	HeapTuple	tuple;

	/*
	 * The type cache's own descriptor of idem_decision, not a copy: it
	 * follows changes of the type and costs no allocation per call.
	 */
	if (!OidIsValid(rettype) || !type_is_rowtype(rettype))
		elog(ERROR, "return type must be a row type");
	tupdesc = lookup_rowtype_tupdesc(rettype, -1);
	check_decision_columns(tupdesc);
	tuple = answer_tuple(tupdesc, answer);
	ReleaseTupleDesc(tupdesc);
	return HeapTupleGetDatum(tuple);
}

/*
 * Add the answer as a row of a set-returning function's result.
 */
static void
answer_store(FunctionCallInfo fcinfo, const IdemAnswer *answer)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	check_decision_columns(rsinfo->setDesc);
	tuplestore_puttuple(rsinfo->setResult,
						answer_tuple(rsinfo->setDesc, answer));
}

/*
 * Refuse an inbox call whose message id is held by a record that only
 * idem_claim makes: a processing attempt whose lease ended, a retryable
 * failure or an unknown outcome under the consumer's name.  Inbox records
 * are done at once and never get there; a consumer name that an operation
 * of idem_claim also uses does.
 */
static void
check_inbox_decision(const ClaimRequest *req, IdemDecision d,
					 const IdemRecord *rec)
{
	if (d.action == IDEM_ACTION_NONE || d.action == IDEM_ACTION_INSERT ||
		d.action == IDEM_ACTION_REUSE)
	{
		if (d.outcome != IDEM_OUTCOME_UNKNOWN)
			return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("message id of consumer \"%s\" is held by an idem_claim record in state \"%s\"",
					text_to_cstring(req->scope.operation),
					idem_state_name(rec->state)),
			 errdetail("idem_inbox records are done at once; this one was made by idem_claim with the same operation name."),
			 errhint("Use a consumer name that no idem_claim operation uses.")));
}

/*
 * What idem_inbox answers for a claim outcome.  A tombstone (expired) is a
 * message that was done: a duplicate.
 */
static const char *
inbox_answer(IdemOutcome outcome)
{
	switch (outcome)
	{
		case IDEM_OUTCOME_PROCEED:
			return "proceed";
		case IDEM_OUTCOME_REPLAY:
		case IDEM_OUTCOME_EXPIRED:
			return "duplicate";
		case IDEM_OUTCOME_IN_PROGRESS:
			return "in_progress";
		case IDEM_OUTCOME_MISMATCH:
			return "mismatch";
		case IDEM_OUTCOME_UNKNOWN:
		case IDEM_OUTCOME_RATE_LIMITED:	/* the inbox is never limited */
			break;
	}
	elog(ERROR, "unexpected inbox outcome %d", (int) outcome);
	pg_unreachable();
}

/*
 * Define the claims' settings: the per-call defaults.  Called from _PG_init
 * on every load, so that a session that has not preloaded the library
 * still sees them.
 */
void
idem_claim_init(void)
{
	DefineCustomIntVariable("idempotency.default_ttl",
							"How long a finished record is kept for replay.",
							"Used when idem_claim is called without ttl.",
							&idem_default_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.default_lease",
							"How long a claimed attempt owns its key before its lease expires.",
							"Used when idem_claim or idem_heartbeat is called without lease.",
							&idem_default_lease_ms,
							30 * 1000, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.claim_wait",
							"How long a claim waits for another attempt of the same key to finish.",
							"Zero never blocks: the claim answers in_progress at once.",
							&idem_claim_wait_ms,
							0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}
