/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by the files of the idempotency extension: the
 *	  settings defined in idempotency.c and the names of the extension's
 *	  catalog objects.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#define IDEM_EXTENSION_NAME		"idempotency"
#define IDEM_RECORDS_TABLE		"idem_records"
#define IDEM_SCOPE_INDEX		"idem_records_scope_key"
#define IDEM_ARCHIVE_TABLE		"idem_records_archive"
/* The columns a copy in the archive takes from idem_records, by name. */
#define IDEM_ARCHIVE_COLUMNS \
	"id, role, tenant, caller, operation, key, fingerprint, state," \
	" attempt, attempt_token, recovery_point, locked_until," \
	" on_lease_expiry, ttl, response_status, response_headers," \
	" response_body, resource_id, created_at, claimed_at, updated_at," \
	" completed_at, expires_at, response_raw_body, response_sealed"
/* ... and from 1.3 on (IdemCatalog.role_is_oid), former_role */
#define IDEM_ARCHIVE_COLUMNS_1_3 IDEM_ARCHIVE_COLUMNS ", former_role"

/* idempotency.cleanup_action */
typedef enum IdemCleanupAction
{
	IDEM_CLEANUP_DELETE,
	IDEM_CLEANUP_ARCHIVE
} IdemCleanupAction;

/* Settings (idempotency.*), defined in idempotency.c */
extern int	idem_default_ttl_s;
extern int	idem_default_lease_ms;
extern int	idem_claim_wait_ms;
extern int	idem_max_key_length;
extern int	idem_max_response_size;
extern char *idem_worker_databases;
extern int	idem_naptime_ms;
extern int	idem_cleanup_batch_size;
extern int	idem_cleanup_max_batches;
extern int	idem_cleanup_grace_s;
extern int	idem_tombstone_ttl_s;
extern int	idem_cleanup_action;
extern int	idem_cleanup_delay_ms;
extern int	idem_max_new_keys_per_second;
extern bool idem_synchronous_outcomes;
extern bool idem_preloaded;

#endif							/* IDEMPOTENCY_H */
