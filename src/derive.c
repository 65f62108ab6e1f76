/*-------------------------------------------------------------------------
 *
 * derive.c
 *	  idem_derive_key: a deterministic key for a downstream call or an
 *	  outbox event, derived from the command's idempotency key and a step
 *	  name, so that a retried command never mints a new downstream identity.
 *
 * The result is the SHA-256 of a length-prefixed encoding of key and step
 * (so that ("ab", "c") and ("a", "bc") differ), its first 16 bytes written
 * as a UUID of version 8 (RFC 9562, custom), which payment providers and
 * message brokers accept as an idempotency key or message id.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "validate.h"

PG_FUNCTION_INFO_V1(idem_derive_key);

static void hash_part(pg_cryptohash_ctx *ctx, text *part);

/*
 * idem_derive_key(key, step) returns text
 */
Datum
idem_derive_key(PG_FUNCTION_ARGS)
{
	static const char domain[] = "idempotency derive_key v1";
	text	   *key;
	text	   *step;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	pg_cryptohash_ctx *ctx;
	char		out[37];
	int			i;
	int			o = 0;

	/* not STRICT: a NULL key must not quietly give a NULL downstream key */
	idem_require_arg(fcinfo, 0, "key");
	idem_require_arg(fcinfo, 1, "step");
	key = PG_GETARG_TEXT_PP(0);
	step = PG_GETARG_TEXT_PP(1);
	idem_check_key(key);
	idem_check_name(step, "step", false);

	ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) domain, sizeof(domain)) < 0)
		elog(ERROR, "could not compute SHA-256: %s", pg_cryptohash_error(ctx));
	hash_part(ctx, key);
	hash_part(ctx, step);
	if (pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		elog(ERROR, "could not compute SHA-256: %s", pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);

	digest[6] = (digest[6] & 0x0f) | 0x80;	/* version 8 */
	digest[8] = (digest[8] & 0x3f) | 0x80;	/* variant 10 */
	for (i = 0; i < 16; i++)
	{
		static const char hex[] = "0123456789abcdef";

		if (i == 4 || i == 6 || i == 8 || i == 10)
			out[o++] = '-';
		out[o++] = hex[digest[i] >> 4];
		out[o++] = hex[digest[i] & 0x0f];
	}
	out[o] = '\0';
	PG_RETURN_TEXT_P(cstring_to_text(out));
}

/*
 * Feed one length-prefixed part to the hash.
 */
static void
hash_part(pg_cryptohash_ctx *ctx, text *part)
{
	uint32		len = VARSIZE_ANY_EXHDR(part);
	uint8		prefix[4];

	prefix[0] = len >> 24;
	prefix[1] = len >> 16;
	prefix[2] = len >> 8;
	prefix[3] = len;
	if (pg_cryptohash_update(ctx, prefix, 4) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) VARDATA_ANY(part), len) < 0)
		elog(ERROR, "could not compute SHA-256: %s", pg_cryptohash_error(ctx));
}
