/*-------------------------------------------------------------------------
 *
 * security.c
 *	  Who a call acts for, what its SQL runs as, and whether it may write.
 *
 * The idem_* functions are not SECURITY DEFINER: the role that calls them
 * (current_user at the call) is part of the scope of every record it
 * creates or reads, so two roles never see each other's records.  That role
 * needs only EXECUTE on the functions, no privilege on idem_records: for
 * the statements on the table the functions switch to the table's owner,
 * the way the foreign key triggers do (ri_triggers.c), with
 * SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS, and switch back
 * afterwards.  An error on the way is fine: aborting the (sub)transaction
 * restores the user and security context in force when it began.
 *
 * The flags make a record write behave like an INSERT or UPDATE by the
 * owner.  SECURITY_LOCAL_USERID_CHANGE, as for a SECURITY DEFINER
 * function, keeps SET ROLE and SET SESSION AUTHORIZATION out while the
 * owner's identity is borrowed.  SECURITY_RESTRICTED_OPERATION is not used:
 * it is meant for maintenance commands that run a table owner's code in a
 * more privileged session, and it refuses deferred triggers, so a deferred
 * constraint the owner added made every claim fail.  The code it would fence
 * in here (triggers, CHECK and default expressions of idem_records) is the
 * owner's, and runs as the owner in any INSERT of theirs.
 * SECURITY_NOFORCE_RLS: the functions enforce role isolation themselves
 * (security.c, records.c), so row level security policies on idem_records,
 * even with FORCE ROW LEVEL SECURITY, apply to none of their statements,
 * read or write, direct or through SPI, as for foreign key checks.
 *
 * Running as the owner is only safe because every statement in records.c
 * names its objects with their schema (the table through the extension's
 * schema, operators as OPERATOR(pg_catalog.=), values as typed parameters),
 * so that nothing a user creates or puts on search_path changes what the
 * statements do.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_class.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/syscache.h"

#include "catalog.h"
#include "pg_compat.h"
#include "security.h"
#include "sha256.h"

static Oid	records_owner(void);
static void forget_role_name(Datum arg, int cacheid, uint32 hashvalue);

/*
 * The name of the role the last call acted for, kept between calls: every
 * claim names its role, and a role is rarely renamed.  Any change to
 * pg_authid forgets it, at the moments the catalog caches themselves
 * learn of changes.
 */
static Oid	role_name_oid = InvalidOid;
static char role_name[NAMEDATALEN];

/*
 * The role the call acts for: current_user when the function was called
 * (the functions are not SECURITY DEFINER).  A record belongs to it by
 * its identity, so that a rename keeps a role's records and a new role
 * given a dropped role's name finds none of them.  Must be called before
 * idem_become_owner.
 */
Oid
idem_calling_role(void)
{
	return GetUserId();
}

/*
 * Name of a role, as text.
 */
static text *
role_name_of(Oid roleid)
{
	static bool callback_registered = false;

	if (roleid != role_name_oid)
	{
		if (!callback_registered)
		{
			CacheRegisterSyscacheCallback(AUTHOID, forget_role_name, (Datum) 0);
			callback_registered = true;
		}
		strlcpy(role_name, GetUserNameFromId(roleid, false), NAMEDATALEN);
		role_name_oid = roleid;
	}
	return cstring_to_text(role_name);
}

/*
 * The value of the role column for a role (the calling role, taken before
 * idem_become_owner): its identity where the column is a regrole (1.3 on),
 * its name where the SQL installed is older and the column still text
 * (until ALTER EXTENSION ... UPDATE).
 */
Datum
idem_role_column(Oid role)
{
	if (idem_catalog()->role_is_oid)
		return ObjectIdGetDatum(role);
	return PointerGetDatum(role_name_of(role));
}

/*
 * Whether a value of the role column (not NULL) is a role's.  Names
 * compare as bytes (the text column's collation is "C").
 */
bool
idem_role_column_is(Datum value, Oid role)
{
	text	   *name;
	text	   *wanted;
	bool		same;

	if (idem_catalog()->role_is_oid)
		return DatumGetObjectId(value) == role;
	name = DatumGetTextPP(value);
	wanted = role_name_of(role);
	same = VARSIZE_ANY_EXHDR(name) == VARSIZE_ANY_EXHDR(wanted) &&
		memcmp(VARDATA_ANY(name), VARDATA_ANY(wanted),
			   VARSIZE_ANY_EXHDR(name)) == 0;
	pfree(wanted);
	return same;
}

/*
 * The role a value of the role column names: its identity, or for a
 * name (before 1.3) the role of that name now; InvalidOid when none.
 */
Oid
idem_role_column_role(Datum value)
{
	char	   *name;
	Oid			role;

	if (idem_catalog()->role_is_oid)
		return DatumGetObjectId(value);
	name = text_to_cstring(DatumGetTextPP(value));
	role = get_role_oid(name, true);
	pfree(name);
	return role;
}

/*
 * The caller a call's scope stores, given the caller it names (NULL: none,
 * the role itself).  Until 1.2 a record that its role made for itself had
 * the role's name as its caller, the default of the functions' caller
 * argument (current_user): a rename changed the caller of every new call,
 * and the key proceeded again.  From 1.3 the role itself is the empty
 * string, which no call can name (a caller must not be empty), and a
 * caller that names the calling role is refused: the same text would name
 * another caller once the role is renamed, or be the role itself once a
 * role is renamed to it.  Under older SQL, the name, as before.  Must be
 * called before idem_become_owner.
 */
text *
idem_scope_caller(text *caller)
{
	text	   *name;
	bool		is_role;

	if (!idem_catalog()->role_is_oid)
		return caller != NULL ? caller : role_name_of(idem_calling_role());
	if (caller == NULL)
		return cstring_to_text("");
	name = role_name_of(idem_calling_role());
	is_role = VARSIZE_ANY_EXHDR(caller) == VARSIZE_ANY_EXHDR(name) &&
		memcmp(VARDATA_ANY(caller), VARDATA_ANY(name),
			   VARSIZE_ANY_EXHDR(name)) == 0;
	pfree(name);
	if (is_role)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("caller must not name the calling role"),
				 errdetail("A role's own records are its default scope; a caller names someone calling within the role."),
				 errhint("Pass no caller (or NULL) for the role itself.")));
	return caller;
}

/* A syscache callback: pg_authid changed, the name kept may be stale. */
static void
forget_role_name(Datum arg, int cacheid, uint32 hashvalue)
{
	(void) arg;
	(void) cacheid;
	(void) hashvalue;
	role_name_oid = InvalidOid;
}

/*
 * Whether the calling role may act on every role's records: the owner of
 * idem_records, a member of the owner role, or a superuser.
 */
bool
idem_calling_role_is_operator(void)
{
	return pg_class_ownercheck_compat(idem_catalog()->table_oid, GetUserId());
}

/*
 * Run as the owner of idem_records from now on, remembering the current
 * user in ctx.
 */
void
idem_become_owner(IdemUserContext *ctx)
{
	Oid			owner = records_owner();

	GetUserIdAndSecContext(&ctx->saved_userid, &ctx->saved_sec_context);
	SetUserIdAndSecContext(owner,
						   ctx->saved_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_NOFORCE_RLS);
}

/*
 * Return to the user idem_become_owner saved.
 */
void
idem_restore_user(const IdemUserContext *ctx)
{
	SetUserIdAndSecContext(ctx->saved_userid, ctx->saved_sec_context);
}

/*
 * Raise a clear error when the current transaction cannot write: on a
 * standby (hot standby answers replays, never claims) or in a read-only
 * transaction.
 */
void
idem_require_writable(const char *what)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot %s on a standby server", what),
				 errdetail("The server is in recovery: idempotency records can be read here but not written."),
				 errhint("Send claims and their completions to the primary; idem_replay() and claims that replay work on a standby.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot %s in a read-only transaction", what),
				 errhint("Claims that replay and idem_replay() work read-only; anything that writes a record needs a read-write transaction.")));
}

/*
 * A user-supplied string shortened for an error message: at most maxlen
 * bytes, cut at a character boundary, with "..." when it was longer.  Keys
 * and bodies never go into messages; short enumerated values (a state, a
 * policy) do, but a 10 MB one should not end up in the server log.
 */
char *
idem_clip(const char *value, int maxlen)
{
	int			len = strlen(value);
	int			cut;

	if (len <= maxlen)
		return pstrdup(value);
	cut = pg_mbcliplen(value, len, maxlen);
	return psprintf("%.*s...", cut, value);
}

/*
 * How a message names an idempotency key: the first 8 hex digits of the
 * SHA-256 of the key, as the application can log it too
 * (left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 8) in SQL).  A key
 * may carry personal data or be a bearer of sorts; it never goes into a
 * message or the server log whole.
 */
char *
idem_key_hash_prefix(const char *key, int len)
{
	static const char hex[] = "0123456789abcdef";
	uint8		digest[IDEM_SHA256_LEN];
	char	   *out = palloc(IDEM_KEY_HASH_PREFIX_LEN + 1);
	int			i;

	idem_sha256((const uint8 *) key, len, digest);
	for (i = 0; i < IDEM_KEY_HASH_PREFIX_LEN / 2; i++)
	{
		out[2 * i] = hex[digest[i] >> 4];
		out[2 * i + 1] = hex[digest[i] & 0x0f];
	}
	out[IDEM_KEY_HASH_PREFIX_LEN] = '\0';
	return out;
}

/*
 * The key with each quote or backslash character preceded by the character
 * in escapes at the same position of the set quotes ("'\"\\"): how
 * quote_literal, quote_ident, a row's or an array's output and JSON write
 * it.  A zero in escapes leaves that character as it is.
 */
static char *
escaped_key(const char *key, const char *escapes)
{
	static const char quotes[] = "'\"\\";
	StringInfoData buf;
	const char *p;

	initStringInfo(&buf);
	for (p = key; *p; p++)
	{
		const char *q = strchr(quotes, *p);

		if (q != NULL && escapes[q - quotes] != '\0')
			appendStringInfoChar(&buf, escapes[q - quotes]);
		appendStringInfoChar(&buf, *p);
	}
	return buf.data;
}

/*
 * Replace every occurrence of one form of a key by "<key PREFIX>".
 */
static char *
replace_form(const char *message, const char *form, const char *prefix)
{
	StringInfoData buf;
	const char *p = message;
	const char *hit;
	int			formlen = strlen(form);

	initStringInfo(&buf);
	while ((hit = strstr(p, form)) != NULL)
	{
		appendBinaryStringInfo(&buf, p, hit - p);
		appendStringInfo(&buf, "<key %s>", prefix);
		p = hit + formlen;
	}
	appendStringInfoString(&buf, p);
	return buf.data;
}

/*
 * A message with every occurrence of a key replaced by "<key PREFIX>", for
 * errors raised by code that is not ours (a trigger, a constraint's cast)
 * that may quote the row.  The key's escaped forms are replaced too, the
 * longest first: as a literal (quote_literal, format's %L), an identifier
 * (quote_ident, %I), a field of a row, an element of an array or a JSON
 * string.
 */
char *
idem_redact_key(const char *message, const char *key)
{
	/* escapes of ', " and \ in each form; '\0' for none */
	static const char *const forms[] = {
		"'\0\\",				/* quote_literal */
		"'\0\0",				/* a literal without backslashes */
		"\0\"\\",				/* a row's field */
		"\0\"\0",				/* an identifier */
		"\0\\\\",				/* an array element, JSON */
	};
	char	   *variants[lengthof(forms) + 1];
	int			nvariants = 0;
	char	   *result;
	char	   *prefix;
	int			i;
	int			j;

	if (key[0] == '\0')
		return pstrdup(message);
	variants[nvariants++] = pstrdup(key);
	for (i = 0; i < (int) lengthof(forms); i++)
	{
		char	   *form = escaped_key(key, forms[i]);
		bool		seen = false;

		for (j = 0; j < nvariants; j++)
			seen |= strcmp(form, variants[j]) == 0;
		if (seen)
			pfree(form);
		else
			variants[nvariants++] = form;
	}
	/* longest first: a shorter form may be part of a longer one */
	for (i = 1; i < nvariants; i++)
		for (j = i; j > 0 && strlen(variants[j]) > strlen(variants[j - 1]); j--)
		{
			char	   *t = variants[j];

			variants[j] = variants[j - 1];
			variants[j - 1] = t;
		}

	prefix = idem_key_hash_prefix(key, strlen(key));
	result = pstrdup(message);
	for (i = 0; i < nvariants; i++)
	{
		if (strstr(result, variants[i]) != NULL)
		{
			char	   *next = replace_form(result, variants[i], prefix);

			pfree(result);
			result = next;
		}
		pfree(variants[i]);
	}
	pfree(prefix);
	return result;
}

/*
 * The owner of idem_records, looked up on every call: an ALTER TABLE ...
 * OWNER TO takes effect at once.
 */
static Oid
records_owner(void)
{
	Oid			table = idem_catalog()->table_oid;
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(table));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", table);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}
