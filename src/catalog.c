/*-------------------------------------------------------------------------
 *
 * catalog.c
 *	  Finds the extension's objects: the schema it was created in, the
 *	  records table and the OIDs of the idem_state and idem_lease_policy
 *	  labels.
 *
 * The lookups run once per backend.  A relcache callback marks them stale
 * when the records table is invalidated, which covers DROP EXTENSION and a
 * later CREATE EXTENSION (possibly in another schema); the next caller then
 * looks them up again.  Callers that cache plans compare the generation
 * number to learn that the table is a new one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "catalog.h"
#include "idempotency.h"

static IdemCatalog catalog;
static bool catalog_valid = false;
static bool callback_registered = false;

static void invalidate_catalog(Datum arg, Oid relid);
static Oid	enum_label_oid(Oid type, const char *label);

/*
 * The extension's catalog objects, looked up if needed.  Raises an error
 * when the extension is not installed in the current database.
 */
const IdemCatalog *
idem_catalog(void)
{
	Oid			ext;
	Oid			nsp;
	Oid			table;
	int			i;

	if (catalog_valid)
		return &catalog;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_catalog, (Datum) 0);
		callback_registered = true;
	}

	ext = get_extension_oid(IDEM_EXTENSION_NAME, true);
	if (!OidIsValid(ext))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"%s\" is not installed in this database",
						IDEM_EXTENSION_NAME),
				 errhint("Run CREATE EXTENSION %s.", IDEM_EXTENSION_NAME)));
	nsp = idem_extension_schema(ext);
	table = get_relname_relid(IDEM_RECORDS_TABLE, nsp);
	if (!OidIsValid(table))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"%s\" of extension \"%s\" does not exist",
						IDEM_RECORDS_TABLE, IDEM_EXTENSION_NAME)));

	if (table != catalog.table_oid)
		catalog.generation++;
	catalog.layout_generation++;
	catalog.schema_oid = nsp;
	catalog.table_oid = table;
	catalog.scope_index_oid = get_relname_relid(IDEM_SCOPE_INDEX, nsp);
	if (!OidIsValid(catalog.scope_index_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("index \"%s\" of extension \"%s\" does not exist",
						IDEM_SCOPE_INDEX, IDEM_EXTENSION_NAME)));
	if (catalog.qualified_table)
		pfree((void *) catalog.qualified_table);
	catalog.qualified_table =
		MemoryContextStrdup(TopMemoryContext,
							quote_qualified_identifier(get_namespace_name(nsp),
													   IDEM_RECORDS_TABLE));

	catalog.state_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										 CStringGetDatum("idem_state"),
										 ObjectIdGetDatum(nsp));
	catalog.policy_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										  CStringGetDatum("idem_lease_policy"),
										  ObjectIdGetDatum(nsp));
	for (i = 0; i < IDEM_NUM_STATES; i++)
		catalog.state_oids[i] = enum_label_oid(catalog.state_type,
											   idem_state_name((IdemState) i));
	for (i = 0; i < IDEM_NUM_POLICIES; i++)
		catalog.policy_oids[i] = enum_label_oid(catalog.policy_type,
												idem_policy_name((IdemLeasePolicy) i));

	catalog_valid = true;
	return &catalog;
}

/*
 * The state whose enum label has the given OID.
 */
IdemState
idem_state_from_oid(const IdemCatalog *cat, Oid value)
{
	int			i;

	for (i = 0; i < IDEM_NUM_STATES; i++)
		if (cat->state_oids[i] == value)
			return (IdemState) i;
	elog(ERROR, "unrecognized idem_state value %u", value);
	pg_unreachable();
}

/*
 * The lease policy whose enum label has the given OID.
 */
IdemLeasePolicy
idem_policy_from_oid(const IdemCatalog *cat, Oid value)
{
	int			i;

	for (i = 0; i < IDEM_NUM_POLICIES; i++)
		if (cat->policy_oids[i] == value)
			return (IdemLeasePolicy) i;
	elog(ERROR, "unrecognized idem_lease_policy value %u", value);
	pg_unreachable();
}

/*
 * Relcache callback: forget the lookups when the records table (or every
 * relation) is invalidated.
 */
static void
invalidate_catalog(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == catalog.table_oid)
		catalog_valid = false;
}

/*
 * OID of one label of an enum type of the extension.
 */
static Oid
enum_label_oid(Oid type, const char *label)
{
	Oid			value;

	value = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
							ObjectIdGetDatum(type), CStringGetDatum(label));
	if (!OidIsValid(value))
		elog(ERROR, "label \"%s\" of enum type %u not found", label, type);
	return value;
}

/*
 * The schema an extension was created in (pg_extension.extnamespace;
 * get_extension_schema() is not exported before PostgreSQL 16).
 */
Oid
idem_extension_schema(Oid ext)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			result = InvalidOid;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		result = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return result;
}
