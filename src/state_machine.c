/*-------------------------------------------------------------------------
 *
 * state_machine.c
 *	  The record states and the one table of allowed transitions, which
 *	  the idem_records_guard trigger (records_guard.c) enforces on every
 *	  INSERT and UPDATE of idem_records, including raw statements by the
 *	  table owner.
 *
 * The claim and attempt code only ever asks for transitions this table
 * allows; the trigger makes sure nothing else can happen to a record:
 *
 *	 from \ to	 processing				   succeeded  failed  retryable  unknown
 *	 (insert)	 attempt 1					   -		  -		  -			 -
 *	 processing  heartbeat, or takeover	   complete   fail	  fail/lease lease
 *				 (attempt+1, lease ended)
 *	 retryable	 new attempt (attempt+1),	   -		  -		  -			 -
 *				 or reuse once expired
 *	 unknown	 -							   resolve	  resolve resolve	 -
 *	 succeeded,  reuse once expired			   -		  -		  -			 -
 *	 failed		 (attempt 1)
 *
 * A record is born processing at attempt 1, or succeeded at attempt 1
 * without a response (idem_inbox: a consumer's message id, recorded as done
 * in the transaction that applies it), except when it is loaded by a
 * COPY FROM statement: that is how pg_restore and psql bring back dumped
 * records, in whatever state they were dumped (only roles that may write
 * the table, that is its owner, can run it; they could as well disable the
 * trigger).
 *
 * Role, scope, key, id and created_at never change; the fingerprint changes only
 * when an expired record is reused for a new command (by idem_inbox, straight
 * to succeeded at attempt 1).  An update that keeps
 * a finished or unknown state (an operator extending expires_at, say) is not
 * a transition and is allowed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "pg_compat.h"
#include "state_machine.h"

static const char *const state_names[IDEM_NUM_STATES] = {
	"processing", "succeeded", "failed", "retryable", "unknown"
};

static const char *const policy_names[IDEM_NUM_POLICIES] = {
	"unknown", "retry"
};

/* allowed[from][to]; the extra conditions are in idem_check_change */
static const bool allowed[IDEM_NUM_STATES][IDEM_NUM_STATES] = {
	/* to: processing succeeded failed retryable unknown */
	[IDEM_PROCESSING] = {true, true, true, true, true},
	[IDEM_SUCCEEDED] = {true, false, false, false, false},
	[IDEM_FAILED] = {true, false, false, false, false},
	[IDEM_RETRYABLE] = {true, false, false, false, false},
	[IDEM_UNKNOWN] = {false, true, true, true, false},
};

pg_noreturn static void reject_change(const IdemChange *change, const char *detail,...)
			pg_attribute_printf(2, 3);

/*
 * Label of a state, as in the idem_state enum.
 */
const char *
idem_state_name(IdemState state)
{
	return state_names[state];
}

/*
 * Label of a lease policy, as in the idem_lease_policy enum.
 */
const char *
idem_policy_name(IdemLeasePolicy policy)
{
	return policy_names[policy];
}

/*
 * Whether a record in this state holds a final answer that is replayed and
 * that expires (retryable holds no answer but expires like one).
 */
bool
idem_state_is_finished(IdemState state)
{
	return state == IDEM_SUCCEEDED || state == IDEM_FAILED ||
		state == IDEM_RETRYABLE;
}

/*
 * Whether the table allows moving from one state to another at all.
 */
bool
idem_transition_allowed(IdemState from, IdemState to)
{
	return allowed[from][to];
}

/*
 * Raise an error unless the change obeys the state machine.
 */
void
idem_check_change(const IdemChange *change)
{
	IdemState	from = change->old_state;
	IdemState	to = change->new_state;
	bool		expired = change->old_expires_at <= change->now;

	/* An expired record reused by idem_inbox: done at once, attempt 1. */
	if (to == IDEM_SUCCEEDED && idem_state_is_finished(from) && expired &&
		change->new_attempt == 1 && change->new_response_empty)
		return;

	/* Keeping a finished or unknown state is not a transition. */
	if (from == to && from != IDEM_PROCESSING)
	{
		if (change->new_attempt != change->old_attempt)
			reject_change(change, "The attempt number changes only when a new attempt starts.");
		if (change->fingerprint_changed)
			reject_change(change, "The fingerprint changes only when an expired record is reused.");
		return;
	}

	if (!idem_transition_allowed(from, to))
		reject_change(change, "A record in state \"%s\" cannot move to state \"%s\".",
					  idem_state_name(from), idem_state_name(to));

	if (to == IDEM_PROCESSING && from != IDEM_PROCESSING && expired &&
		idem_state_is_finished(from))
	{
		/* An expired record is reused for a new command... */
		if (change->new_attempt == 1)
			return;
		/* ... or a retryable one that just expired gets its new attempt. */
		if (from != IDEM_RETRYABLE || change->fingerprint_changed ||
			(int64) change->new_attempt != (int64) change->old_attempt + 1)
			reject_change(change, "A reused record starts again at attempt 1.");
		return;
	}

	if (change->fingerprint_changed)
		reject_change(change, "The fingerprint changes only when an expired record is reused.");

	if (to == IDEM_PROCESSING && from == IDEM_PROCESSING)
	{
		if (change->new_attempt == change->old_attempt)
			return;				/* heartbeat or checkpoint */
		if ((int64) change->new_attempt != (int64) change->old_attempt + 1)
			reject_change(change, "A takeover starts attempt " INT64_FORMAT ".",
						  (int64) change->old_attempt + 1);
		if (change->old_locked_until > change->now)
			reject_change(change, "The lease of attempt %d has not ended.",
						  change->old_attempt);
		return;
	}

	if (to == IDEM_PROCESSING)
	{
		if (from != IDEM_RETRYABLE)
			reject_change(change, "A \"%s\" record can be claimed again only after it expires.",
						  idem_state_name(from));
		if ((int64) change->new_attempt != (int64) change->old_attempt + 1)
			reject_change(change, "A new attempt is attempt " INT64_FORMAT ".",
						  (int64) change->old_attempt + 1);
		return;
	}

	if (change->new_attempt != change->old_attempt)
		reject_change(change, "The attempt number changes only when a new attempt starts.");
}

/*
 * Report a change the state machine does not allow.
 */
static void
reject_change(const IdemChange *change, const char *detail,...)
{
	char		buf[256];
	va_list		args;

	va_start(args, detail);
	vsnprintf(buf, sizeof(buf), detail, args);
	va_end(args);

	ereport(ERROR,
			(errcode(ERRCODE_CHECK_VIOLATION),
			 errmsg("invalid idempotency record transition from \"%s\" to \"%s\"",
					idem_state_name(change->old_state),
					idem_state_name(change->new_state)),
			 errdetail_internal("%s", buf),
			 errhint("Change records through the idem_* functions.")));
}
