/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  Background worker of the idempotency extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

extern void idem_register_workers(void);
extern int	idem_worker_database_count(void);

#endif							/* IDEM_WORKER_H */
