/*-------------------------------------------------------------------------
 *
 * stat_operations.h
 *	  Counters of what happened, per database, role and operation: claim
 *	  outcomes, completions, failures, stale tokens and the maintenance
 *	  passes' work, shown by the view idem_stat_operations.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STAT_OPERATIONS_H
#define IDEM_STAT_OPERATIONS_H

#include "decision.h"

/*
 * The counters of one (database, role, operation).  The claim outcomes
 * come first; stat_operations.c maps every IdemOutcome to one of them.
 */
typedef enum IdemStatCounter
{
	IDEM_STAT_NONE = -1,
	IDEM_STAT_PROCEED = 0,
	IDEM_STAT_REPLAY,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_MISMATCH,
	IDEM_STAT_UNKNOWN,
	IDEM_STAT_EXPIRED,
	IDEM_STAT_RATE_LIMITED,
	IDEM_STAT_COMPLETIONS,
	IDEM_STAT_FAILURES,
	IDEM_STAT_RETRYABLE_FAILURES,
	IDEM_STAT_STALE_TOKENS,
	IDEM_STAT_LEASES_EXPIRED_UNKNOWN,
	IDEM_STAT_LEASES_EXPIRED_RETRYABLE,
	IDEM_STAT_RECORDS_PURGED,
	IDEM_STAT_RECORDS_DELETED,
	IDEM_STAT_NUM_COUNTERS
} IdemStatCounter;

/* idempotency.stat_max, idempotency.track_operations, idempotency.stat_save */
extern int	idem_stat_max;
extern bool idem_stat_track;
extern bool idem_stat_save;

extern void idem_stat_init(void);
extern void idem_stat_define_postmaster_settings(void);
extern void idem_stat_install_hooks(void);

/* Count a claim's answer and the time it took, at once. */
extern void idem_stat_count_claim(Oid userid, text *operation,
								  IdemOutcome outcome, int64 elapsed_usecs);

/* Count something at once (it happened whether or not the caller commits). */
extern void idem_stat_count_now(Oid userid, text *operation,
								IdemStatCounter counter, int64 n);

/* Count a write, when (and if) the current transaction commits. */
extern void idem_stat_count_at_commit(Oid userid, const char *operation,
									  int oplen, IdemStatCounter counter,
									  int64 n);

/* Whether counting is on: the preload's area exists and tracking is on. */
extern bool idem_stat_enabled(void);

#endif							/* IDEM_STAT_OPERATIONS_H */
