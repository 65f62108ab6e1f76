/*-------------------------------------------------------------------------
 *
 * validate.c
 *	  Checks of the arguments of the idem_* functions.  Every check raises
 *	  before anything is written, so a bad call changes nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "common/int.h"
#include "datatype/timestamp.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "pg_compat.h"
#include "security.h"
#include "validate.h"

int			idem_max_key_length = 255;
int			idem_max_response_size = 1024 * 1024;

static Size stored_size(FunctionCallInfo fcinfo, int argno);
static char *interval_text(Interval *value);
static void check_header_name(const JsonbValue *name);
static void check_header_value(const JsonbValue *name, const JsonbValue *value);
static bool is_token_char(unsigned char c);
pg_noreturn static void bad_header_value(const JsonbValue *name);
pg_noreturn static void bad_header_pair(const char *fmt,...) pg_attribute_printf(1, 2);

/*
 * Raise unless argument argno (0-based) is given.
 */
void
idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/*
 * An idempotency key: 1 to idempotency.max_key_length bytes of printable
 * ASCII, as HTTP header values carry them.
 */
void
idem_check_key(text *key)
{
	const unsigned char *p = (const unsigned char *) VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	int			i;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must not be empty")));
	if (len > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key is too long"),
				 errdetail("The key is %d bytes long; the limit is %d.",
						   len, idem_max_key_length),
				 errhint("Raise idempotency.max_key_length to accept longer keys.")));
	for (i = 0; i < len; i++)
	{
		if (p[i] < 0x20 || p[i] > 0x7e)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency key must be printable ASCII"),
					 errdetail("Byte %d of the key is 0x%02x.", i + 1, p[i])));
	}
}

/*
 * An operation, tenant or caller name: at most idempotency.max_key_length
 * bytes with no control characters.
 */
void
idem_check_name(text *value, const char *what, bool allow_empty)
{
	const unsigned char *p = (const unsigned char *) VARDATA_ANY(value);
	int			len = VARSIZE_ANY_EXHDR(value);
	int			i;

	if (len == 0 && !allow_empty)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (len > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errdetail("It is %d bytes long; the limit is %d.",
						   len, idem_max_key_length)));
	for (i = 0; i < len; i++)
	{
		if (p[i] < 0x20 || p[i] == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not contain control characters", what),
					 errdetail("Byte %d is 0x%02x.", i + 1, p[i])));
	}
}

/*
 * An interval argument (ttl, lease, wait) as microseconds, counting a month
 * as 30 days and a day as 24 hours (as EXTRACT(epoch) does, and as leases
 * and waits are applied).  Must be positive, or zero if allowed, and at most
 * IDEM_MAX_INTERVAL_DAYS.
 *
 * Every field must be zero or positive.  A ttl is applied with calendar
 * arithmetic (timestamptz + interval, when a record completes or its lease
 * ends, possibly long after the call), and with mixed signs that depends on
 * the date: '1 mon -30 days' is a day from January 31st and minus a day from
 * March 1st, and '-1 year 360 days 1 hour' looks positive when months count
 * 30 days yet ends before it starts.  With no negative field, start plus the
 * interval is later than start from any date, in either arithmetic; the
 * bound keeps it representable from any date a record can live to.
 */
int64
idem_interval_usecs(Interval *value, const char *what, bool allow_zero)
{
	int64		days;
	int64		usecs;

	if (value->month < 0 || value->day < 0 || value->time < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be %s", what,
						allow_zero ? "zero or positive" : "positive"),
				 errdetail("The value given is %s; no part of it (months, days, time) may be negative.",
						   interval_text(value))));
	if (!allow_zero && value->month == 0 && value->day == 0 && value->time == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", what),
				 errdetail("The value given is %s.", interval_text(value))));
	if (pg_mul_s64_overflow((int64) value->month, DAYS_PER_MONTH, &days) ||
		pg_add_s64_overflow(days, (int64) value->day, &days) ||
		days > IDEM_MAX_INTERVAL_DAYS ||
		pg_mul_s64_overflow(days, USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, value->time, &usecs) ||
		usecs > IDEM_MAX_INTERVAL_DAYS * USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", what),
				 errdetail("The value given is %s; the longest accepted is %d days.",
						   interval_text(value), (int) IDEM_MAX_INTERVAL_DAYS)));
	return usecs;
}

/*
 * start + value in calendar arithmetic (timestamptz + interval, in the
 * session's time zone), as a ttl is applied.  value must have passed
 * idem_interval_usecs: then the sum is later than start and cannot leave
 * the range of timestamps.
 */
TimestampTz
idem_interval_end(TimestampTz start, Interval *value)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(start),
												   IntervalPGetDatum(value)));
}

/*
 * start + usecs, raising when the result is past the end of timestamps.
 */
TimestampTz
idem_timestamp_plus(TimestampTz start, int64 usecs, const char *what)
{
	TimestampTz result;

	if (pg_add_s64_overflow(start, usecs, &result) || !IS_VALID_TIMESTAMP(result))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", what),
				 errdetail("It ends past the largest timestamp.")));
	return result;
}

/*
 * An HTTP status code: 100 to 599.
 */
void
idem_check_http_status(int32 status)
{
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("http_status must be between 100 and 599"),
				 errdetail("The value given is %d.", status)));
}

/*
 * Response headers: a JSON object of strings (1.0's form: one value per
 * name), or a JSON array of [name, value] pairs of strings, kept in order
 * and with repeats (two Set-Cookie headers).  Names must be HTTP tokens and
 * values free of control characters other than tab, so that a replay can
 * never split a response; hop-by-hop headers describe one connection, not
 * the response, and are refused.
 */
void
idem_check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	bool		pairs = JB_ROOT_IS_ARRAY(headers) && !JB_ROOT_IS_SCALAR(headers);
	int			level = 0;
	int			in_pair = 0;
	JsonbValue	name = {0};

	if (!JB_ROOT_IS_OBJECT(headers) && !pairs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object of strings or an array of [name, value] pairs"),
				 errdetail("The value given is a JSON scalar.")));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
			case WJB_BEGIN_ARRAY:
				level++;
				if (pairs && level == 2)
				{
					if (tok != WJB_BEGIN_ARRAY)
						bad_header_pair("An element is an object.");
					in_pair = 0;
				}
				else if (level > 1)
					bad_header_value(&name);
				break;
			case WJB_END_OBJECT:
			case WJB_END_ARRAY:
				if (pairs && level == 2 && in_pair != 2)
					bad_header_pair("A pair holds %d strings; it must hold a name and a value.",
									in_pair);
				level--;
				break;
			case WJB_KEY:
				name = v;
				check_header_name(&name);
				break;
			case WJB_VALUE:
				if (v.type != jbvString)
					bad_header_value(&name);
				check_header_value(&name, &v);
				break;
			case WJB_ELEM:
				if (level == 1)
					bad_header_pair("An element is a JSON %s.",
									v.type == jbvString ? "string" : "scalar");
				if (v.type != jbvString)
					bad_header_pair("A pair holds a JSON value that is not a string.");
				if (++in_pair == 1)
				{
					name = v;
					check_header_name(&name);
				}
				else if (in_pair == 2)
					check_header_value(&name, &v);
				break;
			default:
				break;
		}
	}
}

/*
 * A header name: an HTTP token (RFC 9110), not a hop-by-hop header.
 */
static void
check_header_name(const JsonbValue *name)
{
	static const char *const hop_by_hop[] = {
		"connection", "keep-alive", "proxy-connection", "te", "trailer",
		"transfer-encoding", "upgrade"
	};
	const char *s = name->val.string.val;
	int			len = name->val.string.len;
	int			i;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a header name must not be empty")));
	for (i = 0; i < len; i++)
		if (!is_token_char((unsigned char) s[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header name \"%s\" is not an HTTP token",
							idem_clip(pnstrdup(s, len), 64)),
					 errdetail("Byte %d is 0x%02x; a name is letters, digits and !#$%%&'*+-.^_`|~.",
							   i + 1, (unsigned char) s[i])));
	for (i = 0; i < (int) lengthof(hop_by_hop); i++)
		if (len == (int) strlen(hop_by_hop[i]) &&
			pg_strncasecmp(s, hop_by_hop[i], len) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" is hop-by-hop and cannot be stored",
							pnstrdup(s, len)),
					 errdetail("Connection, Keep-Alive, Proxy-Connection, TE, Trailer, Transfer-Encoding and Upgrade describe one connection, not the response."),
					 errhint("Store the end-to-end headers of the response only.")));
}

/*
 * A header value: no control characters but tab.
 */
static void
check_header_value(const JsonbValue *name, const JsonbValue *value)
{
	const unsigned char *s = (const unsigned char *) value->val.string.val;
	int			i;

	for (i = 0; i < value->val.string.len; i++)
		if ((s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("value of header \"%s\" contains a control character",
							idem_clip(pnstrdup(name->val.string.val,
											   name->val.string.len), 64)),
					 errdetail("Byte %d is 0x%02x; a stored header could split the replayed response.",
							   i + 1, s[i])));
}

static bool
is_token_char(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
		(c >= 'A' && c <= 'Z') || strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static void
bad_header_value(const JsonbValue *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("headers must be a JSON object of strings or an array of [name, value] pairs"),
			 errdetail("Header \"%s\" is not a string.",
					   name->type == jbvString ?
					   idem_clip(pnstrdup(name->val.string.val,
										  name->val.string.len), 64) : "")));
}

static void
bad_header_pair(const char *fmt,...)
{
	va_list		args;
	char		detail[128];

	va_start(args, fmt);
	vsnprintf(detail, sizeof(detail), fmt, args);
	va_end(args);
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("headers must be a JSON object of strings or an array of [name, value] pairs"),
			 errdetail_internal("%s", detail)));
}

/*
 * on_lease_expiry: 'unknown' or 'retry'.
 */
IdemLeasePolicy
idem_parse_policy(text *policy)
{
	char	   *s = text_to_cstring(policy);

	if (strcmp(s, "unknown") == 0)
		return IDEM_POLICY_UNKNOWN;
	if (strcmp(s, "retry") == 0)
		return IDEM_POLICY_RETRY;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid on_lease_expiry \"%s\"", idem_clip(s, 32)),
			 errhint("Use \"unknown\" (the outcome must be reconciled) or \"retry\" (a later claim may run the command again).")));
	pg_unreachable();
}

/*
 * The on_expired argument of idem_claim: true for 'proceed' (a new command
 * over an expired record), false for 'reject' (answer expired).
 */
bool
idem_parse_on_expired(text *value)
{
	char	   *s = text_to_cstring(value);

	if (strcmp(s, "reject") == 0)
		return false;
	if (strcmp(s, "proceed") == 0)
		return true;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid on_expired \"%s\"", idem_clip(s, 32)),
			 errhint("Use \"reject\" (answer expired: the client queries the resource first) or \"proceed\" (run the command again as a new one).")));
	pg_unreachable();
}

/*
 * A response to store: its body, raw body, headers and resource id (argument
 * numbers; -1 for one the function does not take) together within
 * idempotency.max_response_size bytes.  Sizes are read from the values'
 * headers, before anything is detoasted.
 */
void
idem_check_response_size(FunctionCallInfo fcinfo, int body_arg,
						 int headers_arg, int resource_arg, int raw_body_arg)
{
	Size		size = stored_size(fcinfo, body_arg) +
		stored_size(fcinfo, headers_arg) +
		stored_size(fcinfo, resource_arg) +
		stored_size(fcinfo, raw_body_arg);

	if (size > (Size) idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("response is too large to store"),
				 errdetail("Its body, raw body, headers and resource id take %zu bytes; idempotency.max_response_size is %d bytes.",
						   size, idem_max_response_size),
				 errhint("Store the id of the resource the command created and a small body, not the whole document; or raise idempotency.max_response_size.")));
}

/*
 * Another stored value (a recovery point) within
 * idempotency.max_response_size bytes.
 */
void
idem_check_stored_size(Datum value, const char *what)
{
	Size		size = toast_raw_datum_size(value) - VARHDRSZ;

	if (size > (Size) idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is too large to store", what),
				 errdetail("It takes %zu bytes; idempotency.max_response_size is %d bytes.",
						   size, idem_max_response_size)));
}

/*
 * Bytes of a varlena argument, without detoasting it; 0 for NULL or none.
 */
static Size
stored_size(FunctionCallInfo fcinfo, int argno)
{
	if (argno < 0 || PG_ARGISNULL(argno))
		return 0;
	return toast_raw_datum_size(PG_GETARG_DATUM(argno)) - VARHDRSZ;
}

/*
 * An interval's text form, for a message.
 */
static char *
interval_text(Interval *value)
{
	return DatumGetCString(DirectFunctionCall1(interval_out,
											   IntervalPGetDatum(value)));
}

/*
 * Define the limits on what a call may store: a key's length, a
 * response's size.  Called from _PG_init on every load.
 */
void
idem_validate_init(void)
{
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
}
