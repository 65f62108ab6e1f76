/*-------------------------------------------------------------------------
 *
 * worker_status.h
 *	  Shared-memory status of the idempotency background workers: one slot
 *	  per database served, outliving the per-cycle processes, read by
 *	  idem_worker_status().
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_STATUS_H
#define IDEM_WORKER_STATUS_H

#include "datatype/timestamp.h"

/* What one cycle (or one batch of it) changed, added to the counters. */
typedef struct IdemWorkerProgress
{
	int64		rows_expired;	/* leases moved to unknown or retryable */
	int64		rows_deleted;	/* expired records deleted */
	int64		cleanup_batches;	/* cleanup transactions that deleted rows */
} IdemWorkerProgress;

extern void idem_status_install_hooks(int database_count);
extern void idem_status_attach(void);

extern bool idem_status_claim(Oid dboid, int *other_pid);
extern void idem_status_release(Oid dboid);
extern int	idem_status_running_pid(Oid dboid);
extern bool idem_status_begin_cycle(Oid dboid);
extern void idem_status_leave_cycle(void);
extern bool idem_status_take_cycle_done(Oid dboid);
extern bool idem_status_note_waiting(bool waiting);
extern void idem_status_add_progress(const IdemWorkerProgress *progress);
extern void idem_status_end_cycle(bool counted);
extern void idem_status_set_error(const char *message);

#endif							/* IDEM_WORKER_STATUS_H */
