/*-------------------------------------------------------------------------
 *
 * maintenance.h
 *	  The two maintenance passes over idem_records (lease expiry and
 *	  cleanup of expired records), shared by the background worker and the
 *	  SQL functions idem_expire_leases() and idem_cleanup().
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINTENANCE_H
#define IDEM_MAINTENANCE_H

/* The two passes. */
typedef enum IdemPass
{
	IDEM_PASS_LEASES,
	IDEM_PASS_CLEANUP,			/* delete tombstones past their window */
	IDEM_PASS_PURGE,			/* purge the response of expired records */
	IDEM_NUM_PASSES
} IdemPass;

/*
 * One run of a pass, over one or more batches (and transactions): the
 * records it skipped because they could not be processed, left out of its
 * later batches.
 */
typedef struct IdemPassRun
{
	IdemPass	pass;
	MemoryContext context;		/* holds what follows */
	int64	   *skipped;		/* ids of the records skipped */
	int			nskipped;
	int			maxskipped;
	char	   *last_skip;		/* message about the last one, or NULL */
	int64		purged;			/* cleanup: records purged, not deleted */
} IdemPassRun;

/*
 * idempotency.cleanup_batch_size, idempotency.cleanup_max_batches,
 * idempotency.cleanup_grace
 */
extern int	idem_cleanup_batch_size;
extern int	idem_cleanup_max_batches;
extern int	idem_cleanup_grace_s;

extern void idem_maintenance_init(void);
extern Oid	idem_installed_extension(void);
extern void idem_maintenance_prepare(Oid extoid);
extern void idem_maintenance_forget(void);
extern void idem_pass_begin(IdemPassRun *run, IdemPass pass);
extern int64 idem_pass_batch(IdemPassRun *run, int limit, bool *more);

#endif							/* IDEM_MAINTENANCE_H */
