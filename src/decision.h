/*-------------------------------------------------------------------------
 *
 * decision.h
 *	  What a claim answers, given the record it finds.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DECISION_H
#define IDEM_DECISION_H

#include "records.h"

typedef enum IdemOutcome
{
	IDEM_OUTCOME_PROCEED,
	IDEM_OUTCOME_REPLAY,
	IDEM_OUTCOME_IN_PROGRESS,
	IDEM_OUTCOME_MISMATCH,
	IDEM_OUTCOME_UNKNOWN,
	IDEM_OUTCOME_EXPIRED,
	IDEM_OUTCOME_RATE_LIMITED
} IdemOutcome;

/* The write a decision needs before it can be answered. */
typedef enum IdemAction
{
	IDEM_ACTION_NONE,			/* answer from the record as it is */
	IDEM_ACTION_INSERT,			/* no record: attempt 1 of a new command */
	IDEM_ACTION_REUSE,			/* expired record: attempt 1 of a new command */
	IDEM_ACTION_TAKEOVER,		/* lease ended, policy retry: attempt n+1 */
	IDEM_ACTION_NEW_ATTEMPT,	/* retryable: attempt n+1 */
	IDEM_ACTION_MARK_UNKNOWN	/* lease ended, policy unknown */
} IdemAction;

typedef struct IdemDecision
{
	IdemOutcome outcome;
	IdemAction	action;
} IdemDecision;

extern IdemDecision idem_decide(const IdemRecord *rec, const uint8 *fingerprint,
								TimestampTz now, bool proceed_expired);
extern bool idem_action_creates_record(IdemAction action);
extern bool idem_in_tombstone_window(TimestampTz expires_at, TimestampTz now);
extern const char *idem_outcome_name(IdemOutcome outcome);

#endif							/* IDEM_DECISION_H */
