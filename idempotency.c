/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module entry point of the idempotency extension: _PG_init calls the
 *	  init of each concern under src/, which defines that concern's
 *	  idempotency.* settings and installs its hooks, and, when the library
 *	  is loaded through shared_preload_libraries, registers the background
 *	  workers.
 *
 * Settings that only matter at server start (which databases the worker
 * serves, the size of the counters' area) are PGC_POSTMASTER, defined only
 * while shared_preload_libraries is processed; everything else can be
 * changed with a reload or, for the per-call defaults, per session, and is
 * defined on every load, so that a session that has not preloaded the
 * library still sees it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "claim.h"
#include "maintenance.h"
#include "pending_claim.h"
#include "rate_limit.h"
#include "records.h"
#include "response_seal.h"
#include "stat_operations.h"
#include "test_pause.h"
#include "validate.h"
#include "worker.h"
#include "worker_status.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * Module load callback.
 */
void
_PG_init(void)
{
	/* the settings that can change after start-up, on every load */
	idem_claim_init();
	idem_validate_init();
	idem_records_init();
	idem_seal_init(process_shared_preload_libraries_in_progress);
	idem_stat_init();
	idem_maintenance_init();
	idem_worker_init();
	idem_rate_limit_init();
	idem_test_pause_init();
	/* per backend: also when loaded by the first call */
	idem_pending_install_hooks();

	if (!process_shared_preload_libraries_in_progress)
		return;

	/* start-up settings, shared memory and the background workers */
	idem_worker_define_postmaster_settings();
	idem_stat_define_postmaster_settings();
	MarkGUCPrefixReserved("idempotency");
	idem_status_install_hooks(idem_worker_database_count());
	idem_rate_limit_install_hooks();
	idem_stat_install_hooks();
	idem_register_workers();
}
