/*-------------------------------------------------------------------------
 *
 * decision.c
 *	  The decision logic of a claim: given the record found for a scope and
 *	  key (or none), the fingerprint of the request and the time, what the
 *	  claim answers and which write, if any, it must make first.
 *
 * This is the only place that decides; claim.c carries the decision out
 * and state_machine.c guards the writes.  In order:
 *
 *	1. no record								 -> proceed (insert attempt 1)
 *	2. finished record past expires_at:
 *	   within expires_at + tombstone_ttl		 -> expired (unless proceed_expired)
 *	   otherwise								 -> proceed (reuse: attempt 1)
 *	3. fingerprint differs						 -> mismatch
 *	4. succeeded or failed						 -> replay
 *	5. retryable								 -> proceed (attempt n+1)
 *	6. unknown									 -> unknown
 *	7. processing, lease running				 -> in_progress
 *	8. processing, lease ended, policy retry	 -> proceed (takeover: n+1)
 *	9. processing, lease ended, policy unknown	 -> unknown (mark it)
 *
 * A lookup that has no request (idem_replay) passes no fingerprint and
 * skips step 3.
 *
 * The proceeds of steps 1 and 2 create a record, a new command at attempt
 * 1 (idem_action_creates_record): with idempotency.max_new_keys_per_second
 * set, they answer rate_limited instead when the role's rate is spent.
 * claim.c asks rate_limit.c for the token once it owns the key, right
 * before the write, so that a claim that ends up answering something else
 * spends nothing.  A reuse counts as a new record because it would have
 * been an insert had cleanup already deleted the row: whether the worker
 * has run must not change the answer.  Steps 5 and 8 start another attempt
 * of a command already recorded and are never limited, nor is any answer
 * that writes nothing.
 *
 * Step 2 is what makes expiry safe to publish: a retry that comes after the
 * record expired (a queue redelivery, a client back online) must not run
 * the command a second time silently.  For idempotency.tombstone_ttl past
 * expires_at it is told expired, and the client queries the resource
 * before deciding; only a caller that asks for it (on_expired => 'proceed')
 * starts a new command.  The window is measured from expires_at, not from
 * when cleanup purged the response, so the answer does not depend on when
 * the worker last ran.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "datatype/timestamp.h"
#include "common/int.h"

#include "decision.h"

static const char *const outcome_names[] = {
	[IDEM_OUTCOME_PROCEED] = "proceed",
	[IDEM_OUTCOME_REPLAY] = "replay",
	[IDEM_OUTCOME_IN_PROGRESS] = "in_progress",
	[IDEM_OUTCOME_MISMATCH] = "mismatch",
	[IDEM_OUTCOME_UNKNOWN] = "unknown",
	[IDEM_OUTCOME_EXPIRED] = "expired",
	[IDEM_OUTCOME_RATE_LIMITED] = "rate_limited",
};

static inline IdemDecision
decision(IdemOutcome outcome, IdemAction action)
{
	IdemDecision d;

	d.outcome = outcome;
	d.action = action;
	return d;
}

/*
 * Decide what a claim of a scope and key answers.  rec is NULL when no
 * record exists; fingerprint is NULL for a lookup without a request.
 */
IdemDecision
idem_decide(const IdemRecord *rec, const uint8 *fingerprint, TimestampTz now,
			bool proceed_expired)
{
	if (rec == NULL)
		return decision(IDEM_OUTCOME_PROCEED, IDEM_ACTION_INSERT);

	if (idem_state_is_finished(rec->state) && rec->expires_at <= now)
	{
		if (!proceed_expired && idem_in_tombstone_window(rec->expires_at, now))
			return decision(IDEM_OUTCOME_EXPIRED, IDEM_ACTION_NONE);
		return decision(IDEM_OUTCOME_PROCEED, IDEM_ACTION_REUSE);
	}

	if (fingerprint != NULL &&
		memcmp(fingerprint, rec->fingerprint, IDEM_FINGERPRINT_LEN) != 0)
		return decision(IDEM_OUTCOME_MISMATCH, IDEM_ACTION_NONE);

	switch (rec->state)
	{
		case IDEM_SUCCEEDED:
		case IDEM_FAILED:
			return decision(IDEM_OUTCOME_REPLAY, IDEM_ACTION_NONE);
		case IDEM_RETRYABLE:
			return decision(IDEM_OUTCOME_PROCEED, IDEM_ACTION_NEW_ATTEMPT);
		case IDEM_UNKNOWN:
			return decision(IDEM_OUTCOME_UNKNOWN, IDEM_ACTION_NONE);
		case IDEM_PROCESSING:
			if (rec->has_lease && rec->locked_until > now)
				return decision(IDEM_OUTCOME_IN_PROGRESS, IDEM_ACTION_NONE);
			if (rec->on_lease_expiry == IDEM_POLICY_RETRY)
				return decision(IDEM_OUTCOME_PROCEED, IDEM_ACTION_TAKEOVER);
			return decision(IDEM_OUTCOME_UNKNOWN, IDEM_ACTION_MARK_UNKNOWN);
	}
	elog(ERROR, "unrecognized record state %d", (int) rec->state);
	pg_unreachable();
}

/*
 * Whether a decision's write creates a record: a new command, attempt 1.
 * Only those spend idempotency.max_new_keys_per_second.
 */
bool
idem_action_creates_record(IdemAction action)
{
	return action == IDEM_ACTION_INSERT || action == IDEM_ACTION_REUSE;
}

/*
 * Whether a record that expired at expires_at is still a tombstone at now:
 * less than idempotency.tombstone_ttl has passed since.  A window end too
 * far to represent has not come yet.
 */
bool
idem_in_tombstone_window(TimestampTz expires_at, TimestampTz now)
{
	TimestampTz window_end;

	if (pg_add_s64_overflow(expires_at,
							(int64) idem_tombstone_ttl_s * USECS_PER_SEC,
							&window_end))
		return true;
	return now < window_end;
}

/*
 * The outcome as the claim's result row spells it.
 */
const char *
idem_outcome_name(IdemOutcome outcome)
{
	return outcome_names[outcome];
}
