/*-------------------------------------------------------------------------
 *
 * sha256.c
 *	  SHA-256 (FIPS 180-4) of a buffer in memory, in one call.
 *
 * PostgreSQL's cryptohash interface creates, registers with the resource
 * owner and frees a library context for every digest.  For the short
 * canonical texts of typical requests (a few hundred bytes) that costs
 * several times more than the hashing itself, and a claim hashes its
 * request every time, replays included.  canonical.c therefore hashes a
 * text that fits in its first buffer here, and streams longer texts
 * through the cryptohash interface, whose library code is faster per byte.
 * Both give the same digest; the regression tests compare them with
 * sha256() at every length around the block boundaries.
 *
 * On x86-64 processors with the SHA extensions (checked once, with cpuid)
 * the blocks are mixed with those instructions here.  Elsewhere OpenSSL
 * hashes, through a context made once per process: its assembly code for
 * processors without them (SSSE3, AVX2, ARMv8) takes about a third of the
 * instructions that portable C took per block, and valgrind's virtual
 * processor, which the instruction counts of bench/run.sh run on, is one
 * of them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SHA_EXTENSIONS_CODE 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <openssl/evp.h>

#include "sha256.h"

#ifdef HAVE_SHA_EXTENSIONS_CODE

#define BLOCK_LEN 64

static const uint32 round_constants[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
	0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
	0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
	0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
	0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

static inline void
store_be32(uint8 *p, uint32 v)
{
	p[0] = (uint8) (v >> 24);
	p[1] = (uint8) (v >> 16);
	p[2] = (uint8) (v >> 8);
	p[3] = (uint8) v;
}

/* Whether the processor has the SHA extensions (and SSSE3, SSE4.1). */
static bool
have_sha_extensions(void)
{
	unsigned int eax,
				ebx,
				ecx,
				edx;

	if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) ||
		!(ecx & bit_SSSE3) || !(ecx & bit_SSE4_1))
		return false;
	if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
		return false;
	return (ebx & (1u << 29)) != 0;
}

/*
 * Mix one 64-byte block into the state with the SHA extensions.  The state
 * is kept as ABEF and CDGH, the order sha256rnds2 works on; each step does
 * four rounds and prepares the message words four rounds ahead.
 */
__attribute__((target("sha,ssse3,sse4.1")))
static void
compress_sha_extensions(uint32 *state, const uint8 *block)
{
	const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL,
											0x0405060700010203ULL);
	__m128i		abef;
	__m128i		cdgh;
	__m128i		abef_in;
	__m128i		cdgh_in;
	__m128i		tmp;
	__m128i		w[4];
	int			i;

	tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *) &state[0]), 0xB1);	/* CDAB */
	cdgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *) &state[4]), 0x1B);	/* EFGH */
	abef = _mm_alignr_epi8(tmp, cdgh, 8);
	cdgh = _mm_blend_epi16(cdgh, tmp, 0xF0);
	abef_in = abef;
	cdgh_in = cdgh;

	for (i = 0; i < 4; i++)
		w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) (block + 16 * i)),
								byteswap);

	for (i = 0; i < 16; i++)
	{
		__m128i		msg = _mm_add_epi32(w[i % 4],
										_mm_loadu_si128((const __m128i *) &round_constants[4 * i]));

		cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
		abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(msg, 0x0E));

		/* the words of rounds 4 * (i + 4) .. 4 * (i + 4) + 3 */
		if (i < 12)
		{
			__m128i		next = _mm_sha256msg1_epu32(w[i % 4], w[(i + 1) % 4]);

			next = _mm_add_epi32(next, _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4));
			w[i % 4] = _mm_sha256msg2_epu32(next, w[(i + 3) % 4]);
		}
	}

	abef = _mm_add_epi32(abef, abef_in);
	cdgh = _mm_add_epi32(cdgh, cdgh_in);

	tmp = _mm_shuffle_epi32(abef, 0x1B);	/* FEBA */
	cdgh = _mm_shuffle_epi32(cdgh, 0xB1);	/* DCHG */
	_mm_storeu_si128((__m128i *) &state[0], _mm_blend_epi16(tmp, cdgh, 0xF0));	/* DCBA */
	_mm_storeu_si128((__m128i *) &state[4], _mm_alignr_epi8(cdgh, tmp, 8));	/* ABEF */
}
#endif							/* HAVE_SHA_EXTENSIONS_CODE */

/*
 * SHA-256 by OpenSSL, for processors without the SHA extensions: its
 * assembly code (SSSE3, AVX2, ARMv8) takes a third of the instructions of
 * portable C per block.  The digest and its context are looked up and made
 * once per process; each call only initializes the context again.
 */
static void
sha256_openssl(const uint8 *data, size_t len, uint8 *digest)
{
	static EVP_MD_CTX *ctx = NULL;
	static EVP_MD *md = NULL;
	unsigned int digest_len;

	if (md == NULL)
	{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
		md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
		md = (EVP_MD *) EVP_sha256();
#endif
		if (md == NULL)
			elog(ERROR, "could not look up SHA-256 in OpenSSL");
	}
	if (ctx == NULL)
	{
		ctx = EVP_MD_CTX_new();
		if (ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
	}
	if (EVP_DigestInit_ex(ctx, md, NULL) != 1 ||
		EVP_DigestUpdate(ctx, data, len) != 1 ||
		EVP_DigestFinal_ex(ctx, digest, &digest_len) != 1 ||
		digest_len != IDEM_SHA256_LEN)
		elog(ERROR, "could not compute SHA-256 with OpenSSL");
}

/*
 * SHA-256 of len bytes at data, written to digest (IDEM_SHA256_LEN bytes).
 */
void
idem_sha256(const uint8 *data, size_t len, uint8 *digest)
{
#ifdef HAVE_SHA_EXTENSIONS_CODE
	static int	use_extensions = -1;
	uint32		state[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
	};
	uint8		tail[2 * BLOCK_LEN];
	size_t		full = len - len % BLOCK_LEN;
	size_t		rest = len - full;
	size_t		tail_len;
	uint64		bits = (uint64) len * 8;
	size_t		i;

	if (use_extensions < 0)
		use_extensions = have_sha_extensions() ? 1 : 0;
	if (!use_extensions)
	{
		sha256_openssl(data, len, digest);
		return;
	}

	for (i = 0; i < full; i += BLOCK_LEN)
		compress_sha_extensions(state, data + i);

	/* the rest, a one bit, zeros, and the length in bits: one or two blocks */
	memset(tail, 0, sizeof(tail));
	memcpy(tail, data + full, rest);
	tail[rest] = 0x80;
	tail_len = rest + 1 + 8 <= BLOCK_LEN ? BLOCK_LEN : 2 * BLOCK_LEN;
	for (i = 0; i < 8; i++)
		tail[tail_len - 1 - i] = (uint8) (bits >> (8 * i));
	compress_sha_extensions(state, tail);
	if (tail_len == 2 * BLOCK_LEN)
		compress_sha_extensions(state, tail + BLOCK_LEN);

	for (i = 0; i < 8; i++)
		store_be32(digest + 4 * i, state[i]);
#else
	sha256_openssl(data, len, digest);
#endif
}
