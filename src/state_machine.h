/*-------------------------------------------------------------------------
 *
 * state_machine.h
 *	  Record states and the one table of allowed transitions, shared by the
 *	  API and by the idem_records_guard trigger (records_guard.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATE_MACHINE_H
#define IDEM_STATE_MACHINE_H

#include "access/tupdesc.h"
#include "datatype/timestamp.h"

/* In the order of the idem_state enum's labels. */
typedef enum IdemState
{
	IDEM_PROCESSING,
	IDEM_SUCCEEDED,
	IDEM_FAILED,
	IDEM_RETRYABLE,
	IDEM_UNKNOWN
} IdemState;

#define IDEM_NUM_STATES (IDEM_UNKNOWN + 1)

/* In the order of the idem_lease_policy enum's labels. */
typedef enum IdemLeasePolicy
{
	IDEM_POLICY_UNKNOWN,
	IDEM_POLICY_RETRY
} IdemLeasePolicy;

#define IDEM_NUM_POLICIES (IDEM_POLICY_RETRY + 1)

/*
 * What a change of a record does, as the trigger sees it: the old and new
 * values of the columns the rules are about.
 */
typedef struct IdemChange
{
	IdemState	old_state;
	IdemState	new_state;
	int32		old_attempt;
	int32		new_attempt;
	bool		fingerprint_changed;
	TimestampTz old_expires_at;
	TimestampTz old_locked_until;	/* DT_NOBEGIN when NULL */
	TimestampTz now;
	bool		new_response_empty; /* no status, token or lease (inbox) */
} IdemChange;

extern const char *idem_state_name(IdemState state);
extern const char *idem_policy_name(IdemLeasePolicy policy);
extern bool idem_state_is_finished(IdemState state);
extern bool idem_transition_allowed(IdemState from, IdemState to);
extern void idem_check_change(const IdemChange *change);

#endif							/* IDEM_STATE_MACHINE_H */
