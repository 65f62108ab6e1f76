/*-------------------------------------------------------------------------
 *
 * catalog.c
 *	  Finds the extension's objects: the schema it was created in, the
 *	  records table and the OIDs of the idem_state and idem_lease_policy
 *	  labels.
 *
 * The lookups run once per backend.  A relcache callback marks them stale
 * when the records table is invalidated, which covers DROP EXTENSION and a
 * later CREATE EXTENSION (possibly in another schema) and ALTER TABLE ...
 * RENAME; a syscache callback on pg_namespace does the same when the
 * extension's schema is renamed, and one on pg_type and pg_enum when its
 * enum types or their labels are.  The next caller then looks them up again.
 * Callers that cache plans compare the generation number to learn that the
 * table is a new one or has a new qualified name.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "nodes/nodeFuncs.h"
#include "storage/lmgr.h"
#include "storage/sinval.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/ruleutils.h"
#include "utils/syscache.h"

#include "catalog.h"
#include "pg_compat.h"
#include "test_pause.h"

/*
 * The lookups in use.  They are replaced only by a complete set (the
 * lookups fill a struct of their own), so that an error or a cancel half-way
 * leaves the previous set, marked stale, never half of a new one.
 */
static IdemCatalog catalog;
static bool catalog_valid = false;
static bool callbacks_registered = false;

/*
 * Invalidations seen, counted so that a lookup can tell whether one arrived
 * while it ran (it takes locks, and so processes them): its result is used
 * for the call that made it, but looked up again by the next one.
 */
static uint64 invalidation_count = 0;

/*
 * Whether idem_catalog holds the table's lock for this transaction:
 * cleared when the transaction ends, and when a subtransaction is rolled
 * back (it may have taken the lock, which goes with it).
 */
static bool table_locked = false;

/* NAMESPACEOID hash of the schema the lookups found, TYPEOID of its types */
static uint32 schema_hash = 0;
static uint32 state_type_hash = 0;
static uint32 policy_type_hash = 0;

static void look_up(IdemCatalog *fresh);
static void invalidate_catalog(Datum arg, Oid relid);
static void invalidate_catalog_schema(Datum arg, int cacheid, uint32 hashvalue);
static Oid	enum_label_oid(Oid type, const char *label);
static void scope_index_columns(IdemCatalog *fresh, Oid nsp);
static bool read_scope_index(IdemCatalog *fresh, bool *fits, bool *usable);
static void check_column_types(const IdemCatalog *fresh);
static bool extension_version_at_least(Oid ext, int major, int minor);
static Oid	read_extension(Oid ext, char **version);
static Oid	id_index(const IdemCatalog *fresh);
static bool serves_id(HeapTuple index_tuple, AttrNumber id_attnum);
static Oid	index_access_method(Oid index_oid);
static Oid	created_type(const IdemCatalog *fresh, const char *column);
static bool records_as_created(const IdemCatalog *fresh);
static bool check_as_created(Relation rel, const ConstrCheck *check);
static bool index_as_created(Oid index_oid);
static bool default_operator_classes(HeapTuple index_tuple);
static bool predicate_may_fail(Node *node, void *context);
static bool name_in(const char *name, const char *const *names);
pg_noreturn static void unknown_label(const char *type, Oid value);
static void invalidate_catalog_types(Datum arg, int cacheid, uint32 hashvalue);
static void catalog_xact_callback(XactEvent event, void *arg);
static void catalog_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
									 SubTransactionId parentSubid, void *arg);

/*
 * The extension's catalog objects, looked up if needed.  Raises an error
 * when the extension is not installed in the current database.
 */
const IdemCatalog *
idem_catalog(void)
{
	IdemCatalog fresh;
	uint64		invalidations;
	const char *old_name;

	/*
	 * The lock that look_up takes, once per transaction: taking it takes
	 * the invalidations that arrived before it (REINDEX INDEX CONCURRENTLY's
	 * swap of the scope index, say), and REINDEX waits for it before it
	 * marks the index it replaced dead.  Later calls of the transaction
	 * find the lookups as the lock left them, or invalidated since.
	 */
	if (catalog_valid)
	{
		if (!table_locked)
		{
			LockRelationOid(catalog.table_oid, AccessShareLock);
			table_locked = true;
		}
		if (catalog_valid)
			return &catalog;
	}

	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_catalog, (Datum) 0);
		/* ALTER SCHEMA ... RENAME changes the table's qualified name */
		CacheRegisterSyscacheCallback(NAMESPACEOID, invalidate_catalog_schema,
									  (Datum) 0);
		/* ALTER TYPE ... RENAME, RENAME VALUE and ADD VALUE */
		CacheRegisterSyscacheCallback(TYPEOID, invalidate_catalog_types,
									  (Datum) 0);
		CacheRegisterSyscacheCallback(ENUMOID, invalidate_catalog_types,
									  (Datum) 0);
		RegisterXactCallback(catalog_xact_callback, NULL);
		RegisterSubXactCallback(catalog_subxact_callback, NULL);
		callbacks_registered = true;
	}

	invalidations = invalidation_count;
	look_up(&fresh);
	table_locked = true;

	/*
	 * Statements naming the table (records.c's kept plans) are prepared
	 * again when it is another table or its name changed.
	 */
	fresh.generation = catalog.generation;
	if (fresh.table_oid != catalog.table_oid || catalog.qualified_table == NULL ||
		fresh.role_is_oid != catalog.role_is_oid ||
		strcmp(fresh.qualified_table, catalog.qualified_table) != 0)
		fresh.generation++;
	fresh.layout_generation = catalog.layout_generation + 1;

	old_name = catalog.qualified_table;
	catalog = fresh;
	if (old_name != NULL)
		pfree((void *) old_name);
	schema_hash = GetSysCacheHashValue1(NAMESPACEOID,
										ObjectIdGetDatum(catalog.schema_oid));
	state_type_hash = GetSysCacheHashValue1(TYPEOID,
											ObjectIdGetDatum(catalog.state_type));
	policy_type_hash = GetSysCacheHashValue1(TYPEOID,
											 ObjectIdGetDatum(catalog.policy_type));
	catalog_valid = invalidation_count == invalidations;
	return &catalog;
}

/*
 * Look up the extension's objects into *fresh; its qualified_table is
 * allocated in TopMemoryContext.
 */
static void
look_up(IdemCatalog *fresh)
{
	Oid			ext;
	Oid			nsp;
	char	   *nspname;
	int			i;

	memset(fresh, 0, sizeof(*fresh));
	ext = get_extension_oid(IDEM_EXTENSION_NAME, true);
	if (!OidIsValid(ext))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"%s\" is not installed in this database",
						IDEM_EXTENSION_NAME),
				 errhint("Run CREATE EXTENSION %s.", IDEM_EXTENSION_NAME)));
	nsp = idem_extension_schema(ext);
	nspname = get_namespace_name(nsp);
	if (nspname == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_SCHEMA),
				 errmsg("schema of extension \"%s\" does not exist",
						IDEM_EXTENSION_NAME)));
	fresh->schema_oid = nsp;
	fresh->table_oid = get_relname_relid(IDEM_RECORDS_TABLE, nsp);
	if (!OidIsValid(fresh->table_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"%s\" of extension \"%s\" does not exist",
						IDEM_RECORDS_TABLE, IDEM_EXTENSION_NAME),
				 errdetail("The extension looks for it in schema \"%s\", under that name.",
						   nspname),
				 errhint("If it was renamed, rename it back.")));
	/*
	 * Held until the end of the transaction: REINDEX INDEX CONCURRENTLY
	 * waits for the transactions that hold a lock on the table before it
	 * marks the index it replaced dead and before it drops it, so the
	 * scope index found below stays maintained and in place while this
	 * transaction uses it.
	 */
	LockRelationOid(fresh->table_oid, AccessShareLock);
	idem_refuse_citus_table(fresh->table_oid);

	fresh->guard_function = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
											CStringGetDatum("idem_records_guard"),
											PointerGetDatum(buildoidvector(NULL, 0)),
											ObjectIdGetDatum(nsp));
	/*
	 * 1.3 made role a regrole: what the rest reads depends on it.  Taken
	 * from the version installed, not from the column, so that a role
	 * column of 1.3 changed back to text is refused (check_column_types)
	 * rather than served as 1.2's, whose callers differ.
	 */
	fresh->role_is_oid = extension_version_at_least(ext, 1, 3);
	fresh->records_as_created = records_as_created(fresh);
	fresh->state_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										CStringGetDatum("idem_state"),
										ObjectIdGetDatum(nsp));
	fresh->policy_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										 CStringGetDatum("idem_lease_policy"),
										 ObjectIdGetDatum(nsp));
	if (!OidIsValid(fresh->state_type) || !OidIsValid(fresh->policy_type))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("type \"%s\" of extension \"%s\" does not exist",
						OidIsValid(fresh->state_type) ? "idem_lease_policy" : "idem_state",
						IDEM_EXTENSION_NAME),
				 errdetail("The extension looks for it in schema \"%s\", under that name.",
						   nspname),
				 errhint("If it was renamed, rename it back.")));
	for (i = 0; i < IDEM_NUM_STATES; i++)
		fresh->state_oids[i] = enum_label_oid(fresh->state_type,
											  idem_state_name((IdemState) i));
	for (i = 0; i < IDEM_NUM_POLICIES; i++)
		fresh->policy_oids[i] = enum_label_oid(fresh->policy_type,
											   idem_policy_name((IdemLeasePolicy) i));
	check_column_types(fresh);
	scope_index_columns(fresh, nsp);
	fresh->id_index_oid = id_index(fresh);

	/* last: nothing after it can fail and leave it behind */
	fresh->qualified_table =
		MemoryContextStrdup(TopMemoryContext,
							quote_qualified_identifier(nspname, IDEM_RECORDS_TABLE));
}

/*
 * Which part of the scope each column of the unique index holds.  Version
 * 1.0 of the SQL creates it on (role, tenant, caller, operation, key), 1.1
 * with the key first (the rest are equal for most records, so a B-tree
 * comparison that starts with them walks four equal texts first); the
 * library serves both.  An index that is not unique on exactly those five
 * columns cannot answer a claim, and is refused.
 *
 * The index is found by its name, and its pg_index row read, as
 * RangeVarGetRelidExtended resolves a name: the name is looked up, the
 * index locked, its row read, and when invalidations arrived meanwhile
 * (locking and reading the catalogs take them) all of it is done again,
 * since the name may now denote another index.  REINDEX INDEX CONCURRENTLY
 * gives the name to the new index, marks the old one not valid, then dead,
 * then drops it: without the second look, a lookup that straddled the swap
 * would read the old index's row and find it not valid, or gone.  Holding
 * the old index's lock does not keep its name (the swap takes a lock that
 * does not conflict with it), hence the loop rather than one look after
 * the lock.  An old index read before the swap stays usable: look_up
 * holds a lock on the table, which REINDEX waits for before it marks the
 * old index dead.  A name that denotes no index is refused (42704) once
 * the invalidations that arrived are taken and it still denotes none.
 */
static void
scope_index_columns(IdemCatalog *fresh, Oid nsp)
{
	Oid			locked = InvalidOid;
	bool		fits;
	bool		usable;

	for (;;)
	{
		uint64		invalidations = SharedInvalidMessageCounter;
		bool		found = false;

		fresh->scope_index_oid = get_relname_relid(IDEM_SCOPE_INDEX, nsp);
		IDEM_TEST_PAUSE("scope_index_lookup");
		if (fresh->scope_index_oid != locked && OidIsValid(locked))
		{
			UnlockRelationOid(locked, AccessShareLock);
			locked = InvalidOid;
		}
		if (!OidIsValid(fresh->scope_index_oid))
			AcceptInvalidationMessages();	/* the name may be back by now */
		else
		{
			if (!OidIsValid(locked))
			{
				LockRelationOid(fresh->scope_index_oid, AccessShareLock);
				locked = fresh->scope_index_oid;
			}
			found = read_scope_index(fresh, &fits, &usable);
		}
		if (invalidations != SharedInvalidMessageCounter)
			continue;
		if (!OidIsValid(fresh->scope_index_oid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("index \"%s\" of extension \"%s\" does not exist",
							IDEM_SCOPE_INDEX, IDEM_EXTENSION_NAME),
					 errhint("If it was renamed, rename it back.")));
		if (!found)
			elog(ERROR, "cache lookup failed for index %u", fresh->scope_index_oid);
		break;
	}
	if (fits && !usable)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" of extension \"%s\" is not valid",
						IDEM_SCOPE_INDEX, IDEM_EXTENSION_NAME),
				 errdetail("A claim cannot find every record of a key through an index that is still being built or whose build failed."),
				 errhint("Wait for CREATE INDEX CONCURRENTLY to finish, or rebuild it with REINDEX INDEX %s.",
						 IDEM_SCOPE_INDEX)));
	if (!fits)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" of extension \"%s\" is not the unique index of the scope and key",
						IDEM_SCOPE_INDEX, IDEM_EXTENSION_NAME),
				 errdetail("It must be unique on the columns role, tenant, caller, operation and key, in collation \"C\", without expressions or a predicate, and not deferrable."),
				 errhint("Recreate it as the extension's installation script does.")));
}

/*
 * Read the pg_index row of fresh->scope_index_oid: whether it fits the
 * scope (and which part each column holds, into fresh), and whether it is
 * valid, ready and live.  False when it has no row (it was dropped); a
 * relation that is not an index does not fit.
 */
static bool
read_scope_index(IdemCatalog *fresh, bool *fits, bool *usable)
{
	static const char *const part_names[IDEM_SCOPE_PARTS] = {
		"role", "tenant", "caller", "operation", "key"
	};
	HeapTuple	tuple;
	Form_pg_index index;
	oidvector  *collations;
	bool		isnull;
	bool		seen[IDEM_SCOPE_PARTS] = {false};
	char		relkind;
	int			i;

	*fits = false;
	*usable = false;
	relkind = get_rel_relkind(fresh->scope_index_oid);
	if (relkind == '\0')
		return false;
	/* the name given to a relation that is no index fits nothing */
	if (relkind != RELKIND_INDEX && relkind != RELKIND_PARTITIONED_INDEX)
		return true;
	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(fresh->scope_index_oid));
	if (!HeapTupleIsValid(tuple))
		return false;
	index = (Form_pg_index) GETSTRUCT(tuple);
	collations = (oidvector *) DatumGetPointer(SysCacheGetAttr(INDEXRELID, tuple,
															   Anum_pg_index_indcollation,
															   &isnull));
	*fits = index->indrelid == fresh->table_oid && index->indisunique &&
		index->indimmediate && index->indnkeyatts == IDEM_SCOPE_PARTS && !isnull &&
		heap_attisnull(tuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(tuple, Anum_pg_index_indpred, NULL);
	for (i = 0; *fits && i < IDEM_SCOPE_PARTS; i++)
	{
		char	   *name = get_attname(fresh->table_oid,
									   index->indkey.values[i], true);
		int			part;

		/*
		 * The scans compare bytes, as "C" orders them (records.c); a role's
		 * identity has no collation.
		 */
		*fits = false;
		for (part = 0; name != NULL && part < IDEM_SCOPE_PARTS; part++)
			if (!seen[part] && strcmp(name, part_names[part]) == 0 &&
				collations->values[i] ==
				(part == IDEM_SCOPE_ROLE && fresh->role_is_oid ?
				 InvalidOid : C_COLLATION_OID))
			{
				seen[part] = true;
				fresh->scope_index_part[i] = (IdemScopePart) part;
				*fits = true;
				break;
			}
	}
	*usable = index->indisvalid && index->indisready && index->indislive;
	ReleaseSysCache(tuple);
	return true;
}

/*
 * Refuse a table whose columns of the extension do not have the types its
 * scripts gave them (ALTER COLUMN ... TYPE): the library reads and writes
 * their values as those types, and a value of another type read as jsonb,
 * say, is garbage or worse.  A domain over the type is refused too, since
 * the library's writes would not check its constraints.  The scope's
 * columns keep collation "C": a claim looks its key up by bytes, and in an
 * index ordered otherwise would miss a record that exists.
 */
static void
check_column_types(const IdemCatalog *fresh)
{
	Relation	rel = table_open(fresh->table_oid, AccessShareLock);
	TupleDesc	tupdesc = RelationGetDescr(rel);
	static const char *const scope_columns[] = {
		"role", "tenant", "caller", "operation", "key", NULL
	};
	char	   *column = NULL;
	Oid			has = InvalidOid;
	Oid			wants = InvalidOid;
	Oid			collation = InvalidOid;
	int			i;

	for (i = 0; i < tupdesc->natts && column == NULL; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);
		Oid			created;

		if (att->attisdropped)
			continue;
		created = created_type(fresh, NameStr(att->attname));
		if (OidIsValid(created) && att->atttypid != created)
		{
			column = pstrdup(NameStr(att->attname));
			has = att->atttypid;
			wants = created;
		}
		else if (name_in(NameStr(att->attname), scope_columns) &&
				 att->atttypid == TEXTOID &&
				 att->attcollation != C_COLLATION_OID)
		{
			column = pstrdup(NameStr(att->attname));
			collation = att->attcollation;
		}
	}
	table_close(rel, AccessShareLock);
	if (column != NULL && OidIsValid(collation))
		ereport(ERROR,
				(errcode(ERRCODE_COLLATION_MISMATCH),
				 errmsg("column \"%s\" of table \"%s\" has collation %s, not \"C\"",
						column, IDEM_RECORDS_TABLE,
						generate_collation_name(collation)),
				 errdetail("The idempotency extension finds a key by its bytes, as collation \"C\" orders and compares them."),
				 errhint("Change it back with ALTER TABLE ... ALTER COLUMN ... TYPE text COLLATE \"C\".")));
	if (column != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" of table \"%s\" has type %s, not %s",
						column, IDEM_RECORDS_TABLE, format_type_be(has),
						format_type_be(wants)),
				 errdetail("The idempotency extension reads and writes it as %s.",
						   format_type_be(wants)),
				 errhint("Change its type back with ALTER TABLE ... ALTER COLUMN ... TYPE.")));
}

/*
 * Refuse idem_records when it is a Citus table (distributed, reference, or
 * the shell Citus keeps of one on a node): the functions write the table's
 * heap directly, through none of the hooks by which Citus routes writes to
 * shards, so a record would land in this node's local relation, unseen by
 * a claim of the same key that Citus runs elsewhere.  Citus keeps its
 * tables in pg_dist_partition, in pg_catalog where it is installed.
 */
void
idem_refuse_citus_table(Oid relid)
{
	Oid			dist = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	AttrNumber	logicalrelid;
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	bool		distributed;

	if (!OidIsValid(dist))
		return;
	logicalrelid = get_attnum(dist, "logicalrelid");
	if (logicalrelid == InvalidAttrNumber)
		return;
	rel = table_open(dist, AccessShareLock);
	ScanKeyInit(&key, logicalrelid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	distributed = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (distributed)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" of extension \"%s\" is a Citus table",
						IDEM_RECORDS_TABLE, IDEM_EXTENSION_NAME),
				 errdetail("The idempotency functions write this node's own table, which Citus neither routes nor sees: a claim here would miss a record of the same key on another node."),
				 errhint("Keep %s an ordinary table on every node, distribute the business tables, and run claims on the tenant's node through delegated functions (docs/scaling.md).",
						 IDEM_RECORDS_TABLE)));
}

/*
 * Whether the SQL version of the extension installed (pg_extension's
 * extversion, "major.minor") is at least major.minor.
 */
static bool
extension_version_at_least(Oid ext, int major, int minor)
{
	int			has_major = 0;
	int			has_minor = 0;
	char	   *version = NULL;

	(void) read_extension(ext, &version);
	if (version == NULL ||
		sscanf(version, "%d.%d", &has_major, &has_minor) != 2)
		has_major = has_minor = 0;
	return has_major > major || (has_major == major && has_minor >= minor);
}

/*
 * The index through which a record is found by its id (record_writer.c),
 * found by its column rather than taken to be the primary key: the owner
 * may move the primary key to other columns ((tenant, id), say), and a
 * scan of that index with an id as its first column compares an id with
 * whatever the first column holds.  The primary key is preferred where it
 * serves.  A table without such an index, or whose id is no longer an
 * identity column (a new record's id is the identity's next value), cannot
 * be written and is refused here, before anything is.
 */
static Oid
id_index(const IdemCatalog *fresh)
{
	Relation	rel = table_open(fresh->table_oid, AccessShareLock);
	AttrNumber	id_attnum = InvalidAttrNumber;
	bool		identity = false;
	Oid			found = InvalidOid;
	List	   *index_oids;
	ListCell   *lc;
	int			i;

	for (i = 0; i < RelationGetDescr(rel)->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), "id") == 0)
		{
			id_attnum = att->attnum;
			identity = att->attidentity != '\0';
		}
	}
	index_oids = RelationGetIndexList(rel);
	foreach(lc, index_oids)
	{
		HeapTuple	tuple = SearchSysCache1(INDEXRELID,
											ObjectIdGetDatum(lfirst_oid(lc)));

		if (!HeapTupleIsValid(tuple))
			continue;
		if (serves_id(tuple, id_attnum) &&
			(!OidIsValid(found) ||
			 ((Form_pg_index) GETSTRUCT(tuple))->indisprimary))
			found = lfirst_oid(lc);
		ReleaseSysCache(tuple);
	}
	list_free(index_oids);
	table_close(rel, AccessShareLock);

	if (!identity)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"id\" of table \"%s\" is not an identity column",
						IDEM_RECORDS_TABLE),
				 errdetail("The idempotency extension gives a new record the next value of the identity of its id."),
				 errhint("Make it one again with ALTER TABLE %s ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH n), n past the greatest id.",
						 IDEM_RECORDS_TABLE)));
	if (!OidIsValid(found))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" has no unique index on its column \"id\" alone",
						IDEM_RECORDS_TABLE),
				 errdetail("The idempotency extension finds a record by its id through a valid, immediate B-tree index unique on id, without an expression or a predicate."),
				 errhint("Create one with CREATE UNIQUE INDEX ON %s (id), or make (id) the primary key again.",
						 IDEM_RECORDS_TABLE)));
	return found;
}

/*
 * Whether an index (its pg_index row) finds a record by its id: a valid,
 * ready and immediate B-tree index unique on that column alone, with the
 * default operator class, no expression and no predicate.
 */
static bool
serves_id(HeapTuple index_tuple, AttrNumber id_attnum)
{
	Form_pg_index index = (Form_pg_index) GETSTRUCT(index_tuple);

	return id_attnum != InvalidAttrNumber &&
		index->indisunique && index->indimmediate &&
		index->indisvalid && index->indisready && index->indislive &&
		index->indnkeyatts == 1 && index->indkey.values[0] == id_attnum &&
		index_access_method(index->indexrelid) == BTREE_AM_OID &&
		heap_attisnull(index_tuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(index_tuple, Anum_pg_index_indpred, NULL) &&
		default_operator_classes(index_tuple);
}

/* The access method of an index, or InvalidOid when it is gone. */
static Oid
index_access_method(Oid index_oid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(index_oid));
	Oid			am;

	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	am = ((Form_pg_class) GETSTRUCT(tuple))->relam;
	ReleaseSysCache(tuple);
	return am;
}

/*
 * The type the extension's scripts give a column of idem_records, or
 * InvalidOid for a column they do not create.  role is text until 1.2 and
 * regrole from 1.3 on (fresh->role_is_oid says which, look_up having read
 * it first).
 */
static Oid
created_type(const IdemCatalog *fresh, const char *column)
{
	static const struct
	{
		const char *name;
		Oid			type;
	}			columns[] = {
		{"id", INT8OID}, {"tenant", TEXTOID}, {"former_role", TEXTOID},
		{"caller", TEXTOID}, {"operation", TEXTOID}, {"key", TEXTOID},
		{"fingerprint", BYTEAOID}, {"attempt", INT4OID},
		{"attempt_token", BYTEAOID}, {"recovery_point", TEXTOID},
		{"locked_until", TIMESTAMPTZOID}, {"ttl", INTERVALOID},
		{"response_status", INT4OID}, {"response_headers", JSONBOID},
		{"response_body", JSONBOID}, {"resource_id", TEXTOID},
		{"created_at", TIMESTAMPTZOID}, {"claimed_at", TIMESTAMPTZOID},
		{"updated_at", TIMESTAMPTZOID}, {"completed_at", TIMESTAMPTZOID},
		{"expires_at", TIMESTAMPTZOID}, {"response_raw_body", BYTEAOID},
		{"response_sealed", BYTEAOID}, {"request_text_hash", BYTEAOID}
	};
	int			i;

	if (strcmp(column, "role") == 0)
		return fresh->role_is_oid ? REGROLEOID : TEXTOID;
	if (strcmp(column, "state") == 0)
		return fresh->state_type;
	if (strcmp(column, "on_lease_expiry") == 0)
		return fresh->policy_type;
	for (i = 0; i < (int) lengthof(columns); i++)
		if (strcmp(column, columns[i].name) == 0)
			return columns[i].type;
	return InvalidOid;
}

/*
 * Whether idem_records is as the extension's scripts (1.0 or 1.1) created
 * it: no column, default, CHECK or NOT NULL constraint, domain, index or
 * trigger that its owner added, changed, replaced or dropped.  Only then
 * may a claim's record be written at its completion (pending_claim.c):
 * whatever the owner added (a default, a constraint, a unique index, a
 * trigger, a foreign key and its triggers) sees the claim's row at the
 * claim, as it always did.
 */
static bool
records_as_created(const IdemCatalog *fresh)
{
	static const char *const columns[] = {
		"id", "role", "tenant", "caller", "operation", "key", "fingerprint",
		"state", "attempt", "attempt_token", "recovery_point", "locked_until",
		"on_lease_expiry", "ttl", "response_status", "response_headers",
		"response_body", "resource_id", "created_at", "claimed_at",
		"updated_at", "completed_at", "expires_at", "response_raw_body",
		"response_sealed", "former_role", "request_text_hash", NULL
	};
	/* and role until 1.2: from 1.3 a record may belong to no role */
	static const char *const not_null[] = {
		"id", "tenant", "caller", "operation", "key", "fingerprint",
		"state", "attempt", "on_lease_expiry", "ttl", "created_at",
		"claimed_at", "updated_at", "expires_at", NULL
	};
	Relation	rel = table_open(fresh->table_oid, AccessShareLock);
	TupleDesc	tupdesc = RelationGetDescr(rel);
	TriggerDesc *triggers = rel->trigdesc;
	List	   *index_oids;
	ListCell   *lc;
	bool		as_created;
	bool		has_id = false;
	int			i;

	/* a partition's constraint is checked on the row, at the commit */
	as_created = !rel->rd_rel->relispartition &&
		triggers != NULL && triggers->numtriggers == 1 &&
		triggers->triggers[0].tgfoid == fresh->guard_function;
	for (i = 0; as_created && i < tupdesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);
		const char *name = NameStr(att->attname);

		/*
		 * A dropped column: the table was altered (columns moved).  A
		 * default (only role's is the scripts'): the finished row would get
		 * it where the completion stores NULL.
		 */
		as_created = !att->attisdropped && name_in(name, columns) &&
			att->attnotnull == (name_in(name, not_null) ||
								(strcmp(name, "role") == 0 && !fresh->role_is_oid)) &&
			get_typtype(att->atttypid) != TYPTYPE_DOMAIN &&
			(!att->atthasdef || strcmp(name, "role") == 0) &&
			att->attgenerated == '\0' &&
			(att->attidentity != '\0') == (strcmp(name, "id") == 0);
		has_id |= strcmp(name, "id") == 0;
	}
	as_created = as_created && has_id;
	if (as_created && tupdesc->constr != NULL && tupdesc->constr->num_check > 0)
	{
		/*
		 * Deparsed with only pg_catalog on the search path, so that a
		 * function of the session's path that shadows a built-in shows
		 * qualified, whatever the calling session's path.
		 */
		int			save_nestlevel = NewGUCNestLevel();

		(void) set_config_option("search_path", "pg_catalog", PGC_USERSET,
								 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
		for (i = 0; as_created && i < tupdesc->constr->num_check; i++)
			as_created = check_as_created(rel, &tupdesc->constr->check[i]);
		AtEOXact_GUC(true, save_nestlevel);
	}
	index_oids = as_created ? RelationGetIndexList(rel) : NIL;
	foreach(lc, index_oids)
	{
		if (!index_as_created(lfirst_oid(lc)))
			as_created = false;
	}
	list_free(index_oids);
	table_close(rel, AccessShareLock);
	return as_created;
}

/*
 * Whether a CHECK constraint is one of the scripts', by its name and its
 * expression (a constraint the owner replaced under the same name is the
 * owner's).  The expression is compared as PostgreSQL shows it with only
 * pg_catalog on the search path: where that differs (another major
 * version, a function of another schema shadowing a built-in), the
 * constraint counts as the owner's, which only turns writing once off.
 */
static bool
check_as_created(Relation rel, const ConstrCheck *check)
{
	static const char *const checks[][2] = {
		{"idem_records_fingerprint_length", "(octet_length(fingerprint) = 32)"},
		{"idem_records_attempt_positive", "(attempt >= 1)"},
		{"idem_records_status_range",
		"((response_status >= 100) AND (response_status <= 599))"},
		{"idem_records_headers_object",
		"(jsonb_typeof(response_headers) = 'object'::text)"},
		{"idem_records_headers_shape",
		"(jsonb_typeof(response_headers) = ANY (ARRAY['object'::text, 'array'::text]))"},
		{"idem_records_sealed_alone",
		"((response_sealed IS NULL) OR ((response_headers IS NULL) AND (response_body IS NULL) AND (response_raw_body IS NULL)))"}
	};
	int			i;

	for (i = 0; i < (int) lengthof(checks); i++)
	{
		char	   *shown;

		if (strcmp(check->ccname, checks[i][0]) != 0)
			continue;
		shown = deparse_expression(stringToNode(check->ccbin),
								   deparse_context_for(RelationGetRelationName(rel),
													   RelationGetRelid(rel)),
								   false, false);
		return strcmp(shown, checks[i][1]) == 0;
	}
	return false;
}

/*
 * Whether an index is one of the scripts', as far as a row written at
 * commit is concerned: by its name, a btree on the scripts' column with
 * its type's default operator class, without expressions, INCLUDE columns
 * or exclusion, unique only for the primary key on id and the scope's
 * (which scope_index_columns checks), and with no predicate but one that
 * cannot fail on a row.  An index the owner replaced under one of these
 * names that could refuse a row, or raise on one, is the owner's.
 */
static bool
index_as_created(Oid index_oid)
{
	static const char *const indexes[][2] = {
		{"idem_records_pkey", "id"}, {IDEM_SCOPE_INDEX, NULL},
		{"idem_records_lease", "locked_until"},
		{"idem_records_expiry", "expires_at"},
		{"idem_records_unpurged", "expires_at"}
	};
	HeapTuple	class_tuple;
	HeapTuple	tuple;
	Form_pg_index index;
	const char *column = NULL;
	int			which = -1;
	bool		as_created;
	int			i;

	class_tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(index_oid));
	if (!HeapTupleIsValid(class_tuple))
		return false;
	for (i = 0; i < (int) lengthof(indexes); i++)
		if (strcmp(NameStr(((Form_pg_class) GETSTRUCT(class_tuple))->relname),
				   indexes[i][0]) == 0)
			which = i;
	as_created = which >= 0 &&
		((Form_pg_class) GETSTRUCT(class_tuple))->relam == BTREE_AM_OID;
	ReleaseSysCache(class_tuple);
	if (!as_created)
		return false;
	column = indexes[which][1];

	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(index_oid));
	if (!HeapTupleIsValid(tuple))
		return false;
	index = (Form_pg_index) GETSTRUCT(tuple);
	as_created = !index->indisexclusion &&
		index->indnatts == index->indnkeyatts &&
		heap_attisnull(tuple, Anum_pg_index_indexprs, NULL) &&
		default_operator_classes(tuple);
	if (column == NULL)
		as_created = as_created && index->indisunique;
	else
		as_created = as_created && index->indnkeyatts == 1 &&
			index->indkey.values[0] == get_attnum(index->indrelid, column) &&
			index->indisunique == (strcmp(column, "id") == 0) &&
			index->indisprimary == (strcmp(column, "id") == 0);
	if (as_created && !heap_attisnull(tuple, Anum_pg_index_indpred, NULL))
	{
		bool		isnull;
		Datum		pred = SysCacheGetAttr(INDEXRELID, tuple,
										   Anum_pg_index_indpred, &isnull);

		as_created = column != NULL && strcmp(column, "id") != 0 &&
			!predicate_may_fail(stringToNode(TextDatumGetCString(pred)), NULL);
	}
	ReleaseSysCache(tuple);
	return as_created;
}

/*
 * Whether each key column of an index uses its type's default btree
 * operator class: another class's comparison could raise on a row.
 */
static bool
default_operator_classes(HeapTuple index_tuple)
{
	Form_pg_index index = (Form_pg_index) GETSTRUCT(index_tuple);
	oidvector  *classes;
	bool		isnull;
	int			i;

	classes = (oidvector *) DatumGetPointer(SysCacheGetAttr(INDEXRELID, index_tuple,
															Anum_pg_index_indclass,
															&isnull));
	if (isnull)
		return false;
	for (i = 0; i < index->indnkeyatts; i++)
	{
		Oid			type = get_atttype(index->indrelid, index->indkey.values[i]);

		if (classes->values[i] != GetDefaultOpClass(type, BTREE_AM_OID))
			return false;
	}
	return true;
}

/*
 * Whether an index predicate could raise an error on some row.  The
 * scripts' predicates compare the state with labels of its enum and test
 * columns for NULL, which cannot fail; anything else might.
 */
static bool
predicate_may_fail(Node *node, void *context)
{
	if (node == NULL)
		return false;
	switch (nodeTag(node))
	{
		case T_Var:
		case T_Const:
		case T_ArrayExpr:
		case T_BoolExpr:
		case T_NullTest:
		case T_List:
			break;
		case T_OpExpr:
			set_opfuncid((OpExpr *) node);
			if (((OpExpr *) node)->opfuncid != F_ENUM_EQ)
				return true;
			break;
		case T_ScalarArrayOpExpr:
			set_sa_opfuncid((ScalarArrayOpExpr *) node);
			if (((ScalarArrayOpExpr *) node)->opfuncid != F_ENUM_EQ)
				return true;
			break;
		default:
			return true;
	}
	return expression_tree_walker(node, predicate_may_fail, context);
}

static bool
name_in(const char *name, const char *const *names)
{
	for (; *names != NULL; names++)
		if (strcmp(name, *names) == 0)
			return true;
	return false;
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
	unknown_label("idem_state", value);
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
	unknown_label("idem_lease_policy", value);
}

/*
 * A record holds a label of the extension's enum type that the extension
 * does not know: one renamed, or added, after the record was written.
 */
static void
unknown_label(const char *type, Oid value)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("a record of extension \"%s\" holds a label of type \"%s\" the extension does not know",
					IDEM_EXTENSION_NAME, type),
			 errdetail("The label's OID is %u.", value),
			 errhint("Labels of the extension's types must keep their names; rename them back.")));
}

/*
 * Relcache callback: forget the lookups when the records table, its scope
 * index (whose pg_index row says whether it is valid) or every relation is
 * invalidated.
 */
static void
invalidate_catalog(Datum arg pg_attribute_unused(), Oid relid)
{
	if (!OidIsValid(relid) || relid == catalog.table_oid ||
		relid == catalog.scope_index_oid || !catalog_valid)
	{
		catalog_valid = false;
		invalidation_count++;
	}
}

/*
 * Syscache callback on pg_namespace: forget the lookups when the
 * extension's schema (or every schema) changed, its name in particular.
 */
static void
invalidate_catalog_schema(Datum arg pg_attribute_unused(),
						  int cacheid pg_attribute_unused(), uint32 hashvalue)
{
	if (hashvalue == 0 || !catalog_valid || hashvalue == schema_hash)
	{
		catalog_valid = false;
		invalidation_count++;
	}
}

/*
 * Syscache callback on pg_type and pg_enum: forget the lookups when one of
 * the extension's enum types, or any enum label, changed.  Labels change
 * rarely; types are created with every table, so only the extension's own
 * two count.
 */
static void
invalidate_catalog_types(Datum arg pg_attribute_unused(), int cacheid,
						 uint32 hashvalue)
{
	if (hashvalue == 0 || !catalog_valid || cacheid == ENUMOID ||
		hashvalue == state_type_hash || hashvalue == policy_type_hash)
	{
		catalog_valid = false;
		invalidation_count++;
	}
}

/*
 * Transaction end: the table's lock is released (or, at PREPARE, passed
 * to the prepared transaction); the next transaction takes it again.
 */
static void
catalog_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			table_locked = false;
			break;
		default:
			break;
	}
}

/*
 * Subtransaction rolled back: a lock it took is released with it, so the
 * next call takes it again (found held at once if an outer level holds it).
 */
static void
catalog_subxact_callback(SubXactEvent event,
						 SubTransactionId mySubid pg_attribute_unused(),
						 SubTransactionId parentSubid pg_attribute_unused(),
						 void *arg pg_attribute_unused())
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		table_locked = false;
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
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("type \"%s\" of extension \"%s\" has no label \"%s\"",
						format_type_be(type), IDEM_EXTENSION_NAME, label),
				 errhint("If the label was renamed, rename it back.")));
	return value;
}

/*
 * The schema an extension was created in (pg_extension.extnamespace;
 * get_extension_schema() is not exported before PostgreSQL 16).
 */
Oid
idem_extension_schema(Oid ext)
{
	return read_extension(ext, NULL);
}

/*
 * An extension's schema, InvalidOid when there is no such extension, and
 * its version into *version (palloc'd) when version is not NULL.
 */
static Oid
read_extension(Oid ext, char **version)
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
	{
		result = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
		if (version != NULL)
		{
			bool		isnull;
			Datum		value = heap_getattr(tuple, Anum_pg_extension_extversion,
											 RelationGetDescr(rel), &isnull);

			*version = isnull ? NULL : TextDatumGetCString(value);
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return result;
}
