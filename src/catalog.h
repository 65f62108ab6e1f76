/*-------------------------------------------------------------------------
 *
 * catalog.h
 *	  Where the extension's objects are: schema, records table and the OIDs
 *	  of the enum labels, looked up once per backend and again after the
 *	  table or its schema is invalidated (DROP/CREATE EXTENSION, a rename).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CATALOG_H
#define IDEM_CATALOG_H

#include "state_machine.h"

/* The names of the extension and of its catalog objects. */
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
/* ... and from 1.3 on (IdemCatalog.role_is_oid), former_role and request_text_hash */
#define IDEM_ARCHIVE_COLUMNS_1_3 IDEM_ARCHIVE_COLUMNS ", former_role, request_text_hash"

/* The columns of a record's scope and key, in the order IdemScope has them. */
typedef enum IdemScopePart
{
	IDEM_SCOPE_ROLE,
	IDEM_SCOPE_TENANT,
	IDEM_SCOPE_CALLER,
	IDEM_SCOPE_OPERATION,
	IDEM_SCOPE_KEY,
	IDEM_SCOPE_PARTS
} IdemScopePart;

typedef struct IdemCatalog
{
	Oid			schema_oid;
	const char *qualified_table;	/* quoted schema.idem_records */
	Oid			table_oid;
	Oid			scope_index_oid;	/* unique on the scope and key */
	/* the scope part each column of that index holds, in index order */
	IdemScopePart scope_index_part[IDEM_SCOPE_PARTS];
	Oid			id_index_oid;	/* unique on id alone: a record by its id */
	bool		role_is_oid;	/* role holds the role's identity (regrole,
								 * 1.3 on), not its name (text) */
	Oid			guard_function; /* idem_records_guard() */
	bool		records_as_created; /* no column, constraint, index or
									 * trigger of the owner's on the table */
	Oid			state_type;
	Oid			policy_type;
	Oid			state_oids[IDEM_NUM_STATES];
	Oid			policy_oids[IDEM_NUM_POLICIES];
	uint64		generation;		/* changes when table_oid or
								 * qualified_table changes */
	uint64		layout_generation;	/* changes whenever the table's relcache
									 * entry was invalidated (columns may
									 * have moved) */
} IdemCatalog;

extern const IdemCatalog *idem_catalog(void);
extern Oid	idem_extension_schema(Oid ext);
extern void idem_refuse_citus_table(Oid relid);
extern IdemState idem_state_from_oid(const IdemCatalog *cat, Oid value);
extern IdemLeasePolicy idem_policy_from_oid(const IdemCatalog *cat, Oid value);

#endif							/* IDEM_CATALOG_H */
