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

#endif							/* IDEM_WORKER_H */
