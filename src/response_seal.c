/*-------------------------------------------------------------------------
 *
 * response_seal.c
 *	  Encryption at rest of stored responses: AES-256-GCM through OpenSSL's
 *	  EVP interface, with the keys of idempotency.encryption_key and
 *	  idempotency.encryption_key_previous.
 *
 * A record's headers, JSON body and raw body are sealed together into one
 * bytea: a format byte, the id of the key (the first 8 bytes of its SHA-256,
 * so that it names the key without revealing it), a random 12-byte nonce,
 * the ciphertext and the 16-byte tag.  The record's id is authenticated
 * with it, so a sealed response copied onto another record does not open.
 * The plaintext is compressed with pglz first when that makes it smaller:
 * ciphertext does not compress, so TOAST cannot do it afterwards.
 *
 * OpenSSL is what PostgreSQL itself links for TLS and pgcrypto, so using it
 * adds no dependency; calling it directly costs a replay far less than
 * pgcrypto's SQL functions would.
 *
 * The keys are settings only a superuser may set or read; SHOW prints a
 * placeholder instead of a key, for everyone.  The scope, key and
 * fingerprint of a record stay plaintext: they are identifiers and hashes,
 * and the claims look records up by them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include <openssl/evp.h>

#include "common/pg_lzcompress.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "pg_compat.h"
#include "response_seal.h"
#include "sha256.h"

#define SEAL_FORMAT			1
#define SEAL_KEY_LEN		32
#define SEAL_KEY_ID_LEN		8
#define SEAL_NONCE_LEN		12
#define SEAL_TAG_LEN		16
#define SEAL_HEADER_LEN		(1 + SEAL_KEY_ID_LEN + SEAL_NONCE_LEN)

/* Flags of the plaintext's first byte. */
#define PART_HEADERS		0x01
#define PART_BODY			0x02
#define PART_RAW_BODY		0x04
#define PARTS_COMPRESSED	0x80

/* A parsed key: what the check hook hands the assign hook. */
typedef struct SealKey
{
	uint8		key[SEAL_KEY_LEN];
	uint8		id[SEAL_KEY_ID_LEN];
} SealKey;

char	   *idem_encryption_key_text = NULL;
char	   *idem_encryption_key_previous_text = NULL;

/*
 * Whether the library was loaded by shared_preload_libraries (set by
 * idem_seal_init).
 */
static bool preloaded = false;

static const SealKey *current_key = NULL;
static const SealKey *previous_key = NULL;

static void parse_key_into(const char *hex, SealKey *key);
static void append_part(StringInfo buf, const void *data, uint32 len);
static const char *read_part(const char **p, const char *end, uint32 *len);
pg_noreturn static void raise_openssl_failure(const char *what);
static char *key_id_hex(const uint8 *id);

/*
 * Check hook of both key settings: empty (no key), or 64 hexadecimal
 * digits.  A key of any other length is refused, so that a truncated paste
 * never quietly becomes a weaker key.
 */
bool
idem_check_encryption_key(char **newval, void **extra, GucSource source)
{
	const char *value = *newval;
	size_t		len = value ? strlen(value) : 0;
	SealKey    *key;
	size_t		i;

	if (len == 0)
	{
		*extra = NULL;
		return true;
	}

	/*
	 * ALTER ROLE/DATABASE ... SET and a function's SET clause keep the value
	 * in catalogs that every role can read.
	 */
	if (source == PGC_S_TEST || source == PGC_S_DATABASE ||
		source == PGC_S_USER || source == PGC_S_DATABASE_USER)
	{
		GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
		GUC_check_errmsg("an idempotency encryption key cannot be stored in the catalogs");
		GUC_check_errdetail("ALTER ROLE ... SET, ALTER DATABASE ... SET and a function's SET clause keep settings where every role can read them.");
		GUC_check_errhint("Set it in postgresql.conf, a file it includes, or with ALTER SYSTEM.");
		return false;
	}
	for (i = 0; i < len; i++)
		if (!isxdigit((unsigned char) value[i]))
			break;
	if (len != SEAL_KEY_LEN * 2 || i < len)
	{
		GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
		GUC_check_errmsg("an idempotency encryption key must be 64 hexadecimal digits (32 bytes)");
		GUC_check_errdetail("The value given is %zu characters long%s.", len,
							i < len ? " and not hexadecimal" : "");
		GUC_check_errhint("Generate one with: openssl rand -hex 32");
		return false;
	}
	/* the GUC machinery frees extra itself */
	key = (SealKey *) guc_malloc_compat(sizeof(SealKey));
	if (key == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		GUC_check_errmsg("out of memory");
		return false;
	}
	parse_key_into(value, key);
	*extra = key;
	return true;
}

void
idem_assign_encryption_key(const char *newval pg_attribute_unused(), void *extra)
{
	current_key = (const SealKey *) extra;
}

void
idem_assign_encryption_key_previous(const char *newval pg_attribute_unused(),
									void *extra)
{
	previous_key = (const SealKey *) extra;
}

/*
 * What SHOW and pg_settings print for a key: never the key.
 */
const char *
idem_show_encryption_key(void)
{
	return current_key ? "(set)" : "";
}

const char *
idem_show_encryption_key_previous(void)
{
	return previous_key ? "(set)" : "";
}

/*
 * Whether responses stored now are encrypted.
 */
bool
idem_sealing_enabled(void)
{
	if (current_key == NULL)
		return false;

	/*
	 * Until the library is loaded in a session, its settings are plain
	 * placeholders that every role can SHOW: only a library loaded at server
	 * start defines the key's protections before any session reads it.  A
	 * key set without the preload may have been read; it is not used.
	 */
	if (!preloaded)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency.encryption_key is set but the library is not in shared_preload_libraries"),
				 errdetail("Without the preload the key is a plain setting that every role can read, so it is not used and no response is stored."),
				 errhint("Add idempotency to shared_preload_libraries, restart, and set a new key: this one may have been read.")));
	return true;
}

/*
 * Seal a response of record record_id with the current key.  Each part may
 * be NULL (absent); an empty raw body is a part of length zero.
 */
bytea *
idem_seal_response(int64 record_id, const Jsonb *headers, const Jsonb *body,
				   const bytea *raw_body)
{
	StringInfoData parts;
	const char *plain;
	int32		plain_len;
	char	   *compressed = NULL;
	uint8		flags = 0;
	bytea	   *result;
	uint8	   *out;
	EVP_CIPHER_CTX *ctx;
	int			len;
	int64		aad = (int64) pg_hton64((uint64) record_id);

	Assert(current_key != NULL);

	initStringInfo(&parts);
	appendStringInfoCharMacro(&parts, 0);	/* flags, filled in below */
	if (headers)
	{
		flags |= PART_HEADERS;
		append_part(&parts, headers, VARSIZE(headers));
	}
	if (body)
	{
		flags |= PART_BODY;
		append_part(&parts, body, VARSIZE(body));
	}
	if (raw_body)
	{
		flags |= PART_RAW_BODY;
		append_part(&parts, VARDATA_ANY(raw_body), VARSIZE_ANY_EXHDR(raw_body));
	}

	/* compress what follows the flags byte, when that helps */
	plain = parts.data;
	plain_len = parts.len;
	if (parts.len - 1 > 32)
	{
		int32		clen;

		compressed = palloc(1 + sizeof(uint32) + PGLZ_MAX_OUTPUT(parts.len - 1));
		clen = pglz_compress(parts.data + 1, parts.len - 1,
							 compressed + 1 + sizeof(uint32),
							 PGLZ_strategy_default);
		if (clen >= 0)
		{
			uint32		raw_len = pg_hton32((uint32) (parts.len - 1));

			flags |= PARTS_COMPRESSED;
			memcpy(compressed + 1, &raw_len, sizeof(uint32));
			plain = compressed;
			plain_len = 1 + sizeof(uint32) + clen;
		}
	}
	((char *) plain)[0] = (char) flags;

	result = (bytea *) palloc(VARHDRSZ + SEAL_HEADER_LEN + plain_len + SEAL_TAG_LEN);
	out = (uint8 *) VARDATA(result);
	out[0] = SEAL_FORMAT;
	memcpy(out + 1, current_key->id, SEAL_KEY_ID_LEN);
	if (!pg_strong_random(out + 1 + SEAL_KEY_ID_LEN, SEAL_NONCE_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random nonce to encrypt a response")));

	ctx = EVP_CIPHER_CTX_new();
	if (ctx == NULL)
		raise_openssl_failure("create a cipher context");
	if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, current_key->key,
						   out + 1 + SEAL_KEY_ID_LEN) != 1 ||
		EVP_EncryptUpdate(ctx, NULL, &len, (const uint8 *) &aad, sizeof(aad)) != 1 ||
		EVP_EncryptUpdate(ctx, out + SEAL_HEADER_LEN, &len,
						  (const uint8 *) plain, plain_len) != 1 ||
		len != plain_len ||
		EVP_EncryptFinal_ex(ctx, out + SEAL_HEADER_LEN + len, &len) != 1 ||
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_LEN,
							out + SEAL_HEADER_LEN + plain_len) != 1)
	{
		EVP_CIPHER_CTX_free(ctx);
		raise_openssl_failure("encrypt a response");
	}
	EVP_CIPHER_CTX_free(ctx);

	SET_VARSIZE(result, VARHDRSZ + SEAL_HEADER_LEN + plain_len + SEAL_TAG_LEN);
	pfree(parts.data);
	if (compressed)
		pfree(compressed);
	return result;
}

/*
 * Open a response sealed for record record_id, with whichever configured
 * key it names.  Sets each part, or NULL where it was absent.  A response
 * whose key is not configured, or that does not authenticate, raises a
 * clear error: never garbage.
 */
void
idem_open_response(int64 record_id, const bytea *sealed, Jsonb **headers,
				   Jsonb **body, bytea **raw_body)
{
	const uint8 *in = (const uint8 *) VARDATA_ANY(sealed);
	int			in_len = VARSIZE_ANY_EXHDR(sealed);
	const SealKey *key = NULL;
	uint8	   *plain;
	int			plain_len;
	int			len;
	EVP_CIPHER_CTX *ctx;
	int64		aad = (int64) pg_hton64((uint64) record_id);
	const char *p;
	const char *end;
	uint8		flags;
	char	   *expanded = NULL;
	uint32		part_len;
	const char *part;

	*headers = NULL;
	*body = NULL;
	*raw_body = NULL;

	if (in_len < SEAL_HEADER_LEN + SEAL_TAG_LEN + 1 || in[0] != SEAL_FORMAT)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("a stored response is not an encrypted response"),
				 errdetail("The response of idempotency record " INT64_FORMAT " has a format this version does not know.",
						   record_id)));
	if (current_key && memcmp(current_key->id, in + 1, SEAL_KEY_ID_LEN) == 0)
		key = current_key;
	else if (previous_key && memcmp(previous_key->id, in + 1, SEAL_KEY_ID_LEN) == 0)
		key = previous_key;
	if (key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot decrypt a stored response: its key is not configured"),
				 errdetail("The response of idempotency record " INT64_FORMAT " was encrypted with the key whose id is %s, which is neither idempotency.encryption_key nor idempotency.encryption_key_previous.",
						   record_id, key_id_hex(in + 1)),
				 errhint("Set idempotency.encryption_key_previous to the key it was encrypted with.")));

	plain_len = in_len - SEAL_HEADER_LEN - SEAL_TAG_LEN;
	plain = palloc(plain_len);
	ctx = EVP_CIPHER_CTX_new();
	if (ctx == NULL)
		raise_openssl_failure("create a cipher context");
	if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key->key,
						   in + 1 + SEAL_KEY_ID_LEN) != 1 ||
		EVP_DecryptUpdate(ctx, NULL, &len, (const uint8 *) &aad, sizeof(aad)) != 1 ||
		EVP_DecryptUpdate(ctx, plain, &len, in + SEAL_HEADER_LEN, plain_len) != 1 ||
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_LEN,
							(void *) (in + SEAL_HEADER_LEN + plain_len)) != 1)
	{
		EVP_CIPHER_CTX_free(ctx);
		raise_openssl_failure("decrypt a response");
	}
	if (EVP_DecryptFinal_ex(ctx, plain + len, &len) != 1)
	{
		EVP_CIPHER_CTX_free(ctx);
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("a stored response failed its integrity check"),
				 errdetail("The response of idempotency record " INT64_FORMAT " was changed after it was encrypted, or moved from another record.",
						   record_id)));
	}
	EVP_CIPHER_CTX_free(ctx);

	flags = plain[0];
	p = (const char *) plain + 1;
	end = (const char *) plain + plain_len;
	if (flags & PARTS_COMPRESSED)
	{
		uint32		raw_len;

		if (end - p < (int) sizeof(uint32))
			goto corrupt;
		memcpy(&raw_len, p, sizeof(uint32));
		raw_len = pg_ntoh32(raw_len);
		p += sizeof(uint32);
		if (raw_len > MaxAllocSize)
			goto corrupt;
		expanded = palloc(raw_len);
		if (pglz_decompress(p, end - p, expanded, raw_len, true) != (int32) raw_len)
			goto corrupt;
		p = expanded;
		end = expanded + raw_len;
	}

	if (flags & PART_HEADERS)
	{
		if ((part = read_part(&p, end, &part_len)) == NULL || part_len < VARHDRSZ)
			goto corrupt;
		*headers = (Jsonb *) palloc(part_len);
		memcpy(*headers, part, part_len);
	}
	if (flags & PART_BODY)
	{
		if ((part = read_part(&p, end, &part_len)) == NULL || part_len < VARHDRSZ)
			goto corrupt;
		*body = (Jsonb *) palloc(part_len);
		memcpy(*body, part, part_len);
	}
	if (flags & PART_RAW_BODY)
	{
		if ((part = read_part(&p, end, &part_len)) == NULL)
			goto corrupt;
		*raw_body = (bytea *) palloc(VARHDRSZ + part_len);
		SET_VARSIZE(*raw_body, VARHDRSZ + part_len);
		memcpy(VARDATA(*raw_body), part, part_len);
	}
	if (p != end)
		goto corrupt;
	pfree(plain);
	if (expanded)
		pfree(expanded);
	return;

corrupt:
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("a stored response is malformed"),
			 errdetail("The decrypted response of idempotency record " INT64_FORMAT " does not parse.",
					   record_id)));
}

static void
parse_key_into(const char *hex, SealKey *key)
{
	uint8		digest[IDEM_SHA256_LEN];

	hex_decode(hex, SEAL_KEY_LEN * 2, (char *) key->key);
	idem_sha256(key->key, SEAL_KEY_LEN, digest);
	memcpy(key->id, digest, SEAL_KEY_ID_LEN);
}

static void
append_part(StringInfo buf, const void *data, uint32 len)
{
	uint32		n = pg_hton32(len);

	appendBinaryStringInfo(buf, (const char *) &n, sizeof(n));
	appendBinaryStringInfo(buf, (const char *) data, len);
}

/*
 * The next length-prefixed part at *p, or NULL when it overruns end.
 */
static const char *
read_part(const char **p, const char *end, uint32 *len)
{
	const char *part;

	if (end - *p < (int) sizeof(uint32))
		return NULL;
	memcpy(len, *p, sizeof(uint32));
	*len = pg_ntoh32(*len);
	part = *p + sizeof(uint32);
	if ((size_t) (end - part) < *len)
		return NULL;
	*p = part + *len;
	return part;
}

static void
raise_openssl_failure(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("could not %s with OpenSSL", what)));
}

static char *
key_id_hex(const uint8 *id)
{
	char	   *hex = palloc(SEAL_KEY_ID_LEN * 2 + 1);

	hex_encode((const char *) id, SEAL_KEY_ID_LEN, hex);
	hex[SEAL_KEY_ID_LEN * 2] = '\0';
	return hex;
}

/*
 * Define the two key settings.  Called from _PG_init on every load, with
 * whether shared_preload_libraries is being processed: only a key defined
 * then is protected before any session reads it.
 */
void
idem_seal_init(bool shared_preload)
{
	preloaded = shared_preload;
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
}
