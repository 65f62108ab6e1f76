/*-------------------------------------------------------------------------
 *
 * test_pause.c
 *	  Pause points for the concurrency tests (test builds only: see
 *	  test_pause.h).
 *
 * A session sets idempotency.test_pause (superuser only) to the name of a
 * pause point.  When it reaches that point it waits for a share lock on
 * the advisory lock pg_advisory_lock(IDEM_TEST_PAUSE_LOCK) takes, and
 * gives it back at once: while another session holds that advisory lock
 * the backend waits there, and the isolation tester sees it waiting, as for
 * any lock.  The point is passed once per setting: it resets the setting
 * for the rest of the transaction, so later probes of the same statement
 * run on.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#ifdef IDEM_TEST_PAUSE_POINTS

#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/guc.h"

#include "test_pause.h"

/* pg_advisory_lock(478478) */
#define IDEM_TEST_PAUSE_LOCK 478478

static char *pause_at = NULL;

/*
 * Define idempotency.test_pause.
 */
void
idem_test_pause_init(void)
{
	DefineCustomStringVariable("idempotency.test_pause",
							   "Pause point at which this session waits for advisory lock 478478 (test builds only).",
							   NULL,
							   &pause_at,
							   "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL,
							   NULL, NULL, NULL);
}

/*
 * Wait at the pause point name, if this session asked to.
 */
void
idem_test_pause(const char *name)
{
	LOCKTAG		tag;

	if (pause_at == NULL || strcmp(pause_at, name) != 0)
		return;
	(void) set_config_option("idempotency.test_pause", "",
							 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
							 true, 0, false);
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId,
						 (uint32) (((uint64) IDEM_TEST_PAUSE_LOCK) >> 32),
						 (uint32) IDEM_TEST_PAUSE_LOCK, 1);
	(void) LockAcquire(&tag, ShareLock, false, false);
	LockRelease(&tag, ShareLock, false);
}

#endif							/* IDEM_TEST_PAUSE_POINTS */
