/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  Canonical JSON and request fingerprint.
 *
 * Placeholder until the RFC 8785 implementation lands: hashes jsonb's own
 * text output, which is not canonical.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "utils/jsonb.h"

#include "canonical.h"

char *
idem_canonical_cstring(Jsonb *jb, int *len)
{
	char	   *s = JsonbToCString(NULL, &jb->root, VARSIZE(jb));

	*len = strlen(s);
	return s;
}

void
idem_fingerprint_jsonb(Jsonb *jb, uint8 *digest)
{
	int			len;
	char	   *s = idem_canonical_cstring(jb, &len);
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (uint8 *) s, len) < 0 ||
		pg_cryptohash_final(ctx, digest, IDEM_FINGERPRINT_LEN) < 0)
		elog(ERROR, "could not compute SHA-256: %s", pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
	pfree(s);
}
