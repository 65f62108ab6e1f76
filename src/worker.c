/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  Background worker of the idempotency extension: one per database
 *	  named in idempotency.database.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker.h"

/*
 * Register one background worker per database in idempotency.database.
 * Called from _PG_init while shared_preload_libraries is processed.
 */
void
idem_register_workers(void)
{
}
