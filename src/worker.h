/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  Background worker of the idempotency extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

/* idempotency.database, idempotency.naptime, idempotency.cleanup_delay */
extern char *idem_worker_databases;
extern int	idem_naptime_ms;
extern int	idem_cleanup_delay_ms;

extern void idem_worker_init(void);
extern void idem_worker_define_postmaster_settings(void);
extern void idem_register_workers(void);
extern int	idem_worker_database_count(void);

#endif							/* IDEM_WORKER_H */
