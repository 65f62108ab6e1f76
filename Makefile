# Makefile for the idempotency extension (PGXS)

MODULE_big = idempotency
EXTENSION = idempotency
DATA = idempotency--1.0.sql idempotency--1.0--1.1.sql idempotency--1.1--1.2.sql \
	idempotency--1.2--1.3.sql
PG_CPPFLAGS = -I$(srcdir)/src

OBJS = idempotency.o
REGRESS = setup claim pending_claim pending_partition state_machine bad_input \
	table_changes owner_ddl
REGRESS_OPTS = --inputdir=$(srcdir) --encoding=UTF8
ISOLATION = plain_insert_blocks claim_concurrent claim_external isolation_levels
ISOLATION_OPTS = --inputdir=$(srcdir) --load-extension=idempotency
# The suites expect the per-call defaults, whatever the server's
# postgresql.conf says (make installcheck runs against any server).
installcheck: export PGOPTIONS += -c idempotency.default_ttl=1d \
	-c idempotency.default_lease=30s -c idempotency.claim_wait=0
TAP_TESTS = 1

# Canonical JSON and fingerprint
OBJS += src/canonical.o src/sha256.o
REGRESS += canonical canonical_numbers

# Claims, records and the state machine
OBJS += src/state_machine.o src/records_guard.o src/catalog.o src/decision.o src/records.o \
	src/record_writer.o src/pending_claim.o \
	src/key_lock.o src/token.o src/validate.o src/claim.o src/attempt.o \
	src/derive.o

# Pause points for the concurrency specs that hold a backend at a dangerous
# point (src/test_pause.h): make IDEM_TEST_PAUSE=1, as scripts/test.sh builds
OBJS += src/test_pause.o
ifeq ($(IDEM_TEST_PAUSE),1)
PG_CPPFLAGS += -DIDEM_TEST_PAUSE_POINTS
ISOLATION += key_probe_race
endif
# The objects are rebuilt when the build switches between with and without
# them, so that the two are never mixed (an undefined idem_test_pause).
PAUSE_STAMP = .test-pause-$(if $(filter 1,$(IDEM_TEST_PAUSE)),on,off)

# Exact responses: encryption at rest through OpenSSL, which PostgreSQL
# itself links
OBJS += src/response_seal.o
SHLIB_LINK += -lcrypto

# Security: role isolation, least privilege, hostile input
OBJS += src/security.o
REGRESS += security role_identity role_column_text caller_names_role
ISOLATION += claim_roles role_rename token_probe wait_takeover claim_waits_for_table_lock

# Background worker and maintenance passes
OBJS += src/worker.o src/worker_status.o src/maintenance.o
REGRESS += maintenance

# Operations: counters in shared memory, self-service listing
OBJS += src/stat_operations.o src/list.o
REGRESS += stat_operations list

# Expiry: tombstones and the expired answer
REGRESS += expiry archive_faults archive_reuse

# The per-role rate of new keys
OBJS += src/rate_limit.o
REGRESS += rate_limit rate_limit_attack

# Versions: 1.0 updated to the default version keeps every record
REGRESS += upgrade exact_replay

# idem_claim_text: the claim with the request as JSON text (version 1.2)
REGRESS += claim_text

# A retry's request and request_text_hash (version 1.3)
REGRESS += request_text
ISOLATION += claim_text_concurrent

# Batches and consumers: idem_inbox, idem_claim_many, no lock per key
# (claim_prepared tests prepared transactions where max_prepared_transactions
# > 0; expected/claim_prepared_1.out is its output where it is 0)
REGRESS += inbox claim_many
ISOLATION += claim_many_keys claim_prepared
ISOLATION += maintenance_skip_locked maintenance_late_commit expiry_races expiry_races_archive takeover_wait inbox_races isolation_claim_pending claim_many_cancel



PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The TAP tests share their cluster set-up through t/IdemTest.pm: prove
# runs in the source folder, with t/ on its include path.  (Appended to
# PGXS's own flags, so that PROVE_FLAGS=--verbose on the command line
# keeps it.)
PG_PROVE_FLAGS += -I t

# PGXS does not track header dependencies: rebuild every object when one of
# the project's headers changes.
$(OBJS): $(wildcard $(srcdir)/src/*.h)
# (made as the Makefile is read: PGXS's .SECONDARY would not make a missing
# prerequisite)
$(shell test -f $(PAUSE_STAMP) || { rm -f .test-pause-on .test-pause-off; touch $(PAUSE_STAMP); })
$(OBJS): $(PAUSE_STAMP)
EXTRA_CLEAN += .test-pause-on .test-pause-off

# A build outside the source tree (make -f SRC/Makefile VPATH=SRC, as
# pg_buildext builds build-<version>) writes the objects of src/ into a
# src/ of its own.
ifdef VPATH
$(shell mkdir -p src)
endif

# The three suites against an installed server, each run even when another
# fails: make installcheck-all (README, "Running the tests against your own
# server").  PGXS's installcheck stops at the first failing suite.
# Ends with a line "installcheck-all: N of 3 suites failed (...)".
.PHONY: installcheck-all
installcheck-all:
	@failed=; \
	$(MAKE) installcheck ISOLATION= TAP_TESTS= || failed="$$failed regress"; \
	$(MAKE) installcheck REGRESS= TAP_TESTS= || failed="$$failed isolation"; \
	$(MAKE) installcheck REGRESS= ISOLATION= || failed="$$failed tap"; \
	if [ -z "$$failed" ]; then \
		echo "installcheck-all: the 3 suites (regress, isolation, tap) passed"; \
	else \
		set -- $$failed; \
		echo "installcheck-all: $$# of 3 suites failed ($$*): see regression.diffs, output_iso/regression.diffs, tmp_check/log/"; \
		exit 1; \
	fi

# The Debian package, postgresql-<version>-idempotency for each PostgreSQL
# version of debian/pgversions (15+) installed here with its development
# files: Debian's own (15 on Debian 12, 17 on Debian 13, 18 on unstable),
# built by dpkg-buildpackage in a clean copy of the tree (dpkg-buildpackage
# writes next to the folder it builds, and cleans it): the .deb files land
# in build-deb/.  debian/control is made for those versions from
# debian/control.in (pg_buildext updatecontrol).  Unreleased work gets a
# version that says so, never the last release's (scripts/deb_version.sh:
# 1.2.0~dev+git<date>.<commit>-1, say), in a debian/changelog entry of the
# copy (IDEM_DEB_VERSION=... names it instead).  Needs debhelper,
# postgresql-server-dev-all and build-essential (README, "Install the
# package").  make deb-all builds the package of 15, 17 and 18, each in a
# root of its distribution (scripts/deb_all.sh, as root).
.PHONY: deb deb-all
deb-all:
	bash $(srcdir)/scripts/deb_all.sh

deb:
	rm -rf build-deb
	mkdir -p build-deb/src
	tar -C $(srcdir) --exclude-vcs --exclude=./build-deb --exclude='./build-[0-9]*' \
		--exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude=results \
		--exclude=output_iso --exclude=tmp_check --exclude=log --exclude=node_modules \
		--exclude=__pycache__ -cf - . | tar -C build-deb/src -xf -
	@set -e; version=$${IDEM_DEB_VERSION:-$$(bash $(srcdir)/scripts/deb_version.sh $(abspath $(srcdir)))}; \
	released=$$(sed -nE '1s/^[^ ]+ \(([^)]+)\).*/\1/p' $(srcdir)/debian/changelog); \
	if [ "$$version" != "$$released" ]; then \
		echo "deb: unreleased work after $$released: version $$version"; \
		{ echo "pg-idempotency ($$version) UNRELEASED; urgency=medium"; echo; \
		  echo "  * Unreleased work after $${released%-*}: see CHANGELOG.md, \"Unreleased\"."; echo; \
		  sed -n '/^ -- /{p;q}' $(srcdir)/debian/changelog | sed -E "s/>  .*/>  $$(LC_ALL=C date -R)/"; echo; \
		  cat $(srcdir)/debian/changelog; } >build-deb/src/debian/changelog; \
	fi
	cd build-deb/src && pg_buildext updatecontrol
	cd build-deb/src && env -u IDEM_TEST_PAUSE dpkg-buildpackage -us -uc -b
	rm -rf build-deb/src
	@ls build-deb/*.deb
