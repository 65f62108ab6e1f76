/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module entry point of the idempotency extension: defines the
 *	  idempotency.* settings and, when the library is loaded through
 *	  shared_preload_libraries, registers the background workers.
 *
 * Settings that only matter to the worker's start-up (which databases it
 * serves) are PGC_POSTMASTER; everything else can be changed with a reload
 * or, for the per-call defaults, per session.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/guc.h"

#include "idempotency.h"
#include "pending_claim.h"
#include "rate_limit.h"
#include "response_seal.h"
#include "stat_operations.h"
#include "test_pause.h"
#include "worker.h"
#include "worker_status.h"

PG_MODULE_MAGIC;

int			idem_default_ttl_s = 24 * 60 * 60;
int			idem_default_lease_ms = 30 * 1000;
int			idem_claim_wait_ms = 0;
int			idem_max_key_length = 255;
int			idem_max_response_size = 1024 * 1024;
char	   *idem_worker_databases = NULL;
int			idem_naptime_ms = 10 * 1000;
int			idem_cleanup_batch_size = 200;
int			idem_cleanup_max_batches = 500;
int			idem_cleanup_grace_s = 10 * 60;
int			idem_tombstone_ttl_s = 7 * 24 * 60 * 60;
int			idem_cleanup_action = IDEM_CLEANUP_DELETE;

static const struct config_enum_entry cleanup_action_options[] = {
	{"delete", IDEM_CLEANUP_DELETE, false},
	{"archive", IDEM_CLEANUP_ARCHIVE, false},
	{NULL, 0, false}
};
int			idem_cleanup_delay_ms = 50;
int			idem_max_new_keys_per_second = 0;
bool		idem_synchronous_outcomes = true;

/* Whether the library was loaded by shared_preload_libraries. */
bool		idem_preloaded = false;

void		_PG_init(void);

static void define_settings(void);
static void define_postmaster_settings(void);

/*
 * Module load callback.
 */
void
_PG_init(void)
{
	idem_preloaded = process_shared_preload_libraries_in_progress;
	define_settings();
#ifdef IDEM_TEST_PAUSE_POINTS
	idem_test_pause_define_settings();
#endif
	/* per backend: also when loaded by the first call */
	idem_pending_install_hooks();

	if (!process_shared_preload_libraries_in_progress)
		return;

	define_postmaster_settings();
	idem_status_install_hooks(idem_worker_database_count());
	idem_rate_limit_install_hooks();
	idem_stat_install_hooks();
	idem_register_workers();
}

/*
 * Define the idempotency.* settings that can change after start-up.
 * Called on every load so that a session that has not preloaded the
 * library still sees the per-call defaults.
 */
static void
define_settings(void)
{
	DefineCustomIntVariable("idempotency.default_ttl",
							"How long a finished record is kept for replay.",
							"Used when idem_claim is called without ttl.",
							&idem_default_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.default_lease",
							"How long a claimed attempt owns its key before its lease expires.",
							"Used when idem_claim or idem_heartbeat is called without lease.",
							&idem_default_lease_ms,
							30 * 1000, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.claim_wait",
							"How long a claim waits for another attempt of the same key to finish.",
							"Zero never blocks: the claim answers in_progress at once.",
							&idem_claim_wait_ms,
							0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_response_size",
							"Largest response stored for replay: body, headers and resource id together.",
							"Also the limit of a recovery point.  Larger ones are refused with an error.",
							&idem_max_response_size,
							1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_key_length",
							"Longest idempotency key accepted, in bytes.",
							NULL,
							&idem_max_key_length,
							255, 1, 8192,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.synchronous_outcomes",
							 "Commits every transaction that writes an idempotency record synchronously.",
							 "A claim that proceeds, a completion, a failure or a resolve is then on disk "
							 "before anyone is told it, whatever synchronous_commit says.",
							 &idem_synchronous_outcomes,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("idempotency.encryption_key",
							   "Key that encrypts stored responses at rest: 64 hexadecimal digits (AES-256-GCM).",
							   "Empty stores responses in plaintext.  Only superusers may set it; SHOW never prints it.",
							   &idem_encryption_key_text,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   idem_check_encryption_key,
							   idem_assign_encryption_key,
							   idem_show_encryption_key);
	DefineCustomStringVariable("idempotency.encryption_key_previous",
							   "Earlier encryption key, still used to decrypt responses stored before a key rotation.",
							   NULL,
							   &idem_encryption_key_previous_text,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   idem_check_encryption_key,
							   idem_assign_encryption_key_previous,
							   idem_show_encryption_key_previous);
	DefineCustomBoolVariable("idempotency.track_operations",
							 "Counts claim outcomes, completions and maintenance work in idem_stat_operations.",
							 "Needs the library in shared_preload_libraries.",
							 &idem_stat_track,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.stat_save",
							 "Keeps the counters of idem_stat_operations across a clean server restart.",
							 NULL,
							 &idem_stat_save,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.naptime",
							"Time the background worker sleeps between cycles.",
							NULL,
							&idem_naptime_ms,
							10 * 1000, 10, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_batch_size",
							"Expired records deleted per cleanup transaction.",
							NULL,
							&idem_cleanup_batch_size,
							200, 1, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_max_batches",
							"Cleanup transactions per worker cycle.",
							NULL,
							&idem_cleanup_max_batches,
							500, 1, INT_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_delay",
							"Time the background worker sleeps between two cleanup transactions of a cycle.",
							"Spreads the deletion of a large backlog, leaving the processors to the claims meanwhile.",
							&idem_cleanup_delay_ms,
							50, 0, 10 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_grace",
							"Time a record stays past its expiry before cleanup deletes it.",
							NULL,
							&idem_cleanup_grace_s,
							10 * 60, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.tombstone_ttl",
							"Time a finished record is kept as a tombstone past its expiry.",
							"Cleanup purges the stored response of a record past its expiry "
							"and deletes the rest this long after the expiry; until then a "
							"claim of its key answers expired.  0 deletes at once.",
							&idem_tombstone_ttl_s,
							7 * 24 * 60 * 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("idempotency.cleanup_action",
							 "What cleanup does with a record before purging or deleting it.",
							 "archive copies the full record to idem_records_archive first; "
							 "delete does not.",
							 &idem_cleanup_action,
							 IDEM_CLEANUP_DELETE, cleanup_action_options,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_new_keys_per_second",
							"Records each role may create per second in each database.",
							"A claim that would create a record beyond it answers rate_limited "
							"and writes nothing.  0 turns the limit off.  Needs the library in "
							"shared_preload_libraries.",
							&idem_max_new_keys_per_second,
							0, 0, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
}

/*
 * Define the settings that only the postmaster reads.  A PGC_POSTMASTER
 * setting cannot be defined after start-up (that is a FATAL error), so
 * this runs only while shared_preload_libraries is processed, as in
 * contrib/pg_prewarm and worker_spi.
 */
static void
define_postmaster_settings(void)
{
	DefineCustomStringVariable("idempotency.database",
							   "Comma-separated list of databases the background worker serves.",
							   "Takes effect at server start; use idem_launch_worker() for another database without a restart.",
							   &idem_worker_databases,
							   "postgres",
							   PGC_POSTMASTER, 0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.stat_max",
							"Most (database, role, operation) entries idem_stat_operations keeps.",
							"The least recently used are evicted to make room for new ones.",
							&idem_stat_max,
							5000, 100, INT_MAX / 2,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("idempotency");
}
