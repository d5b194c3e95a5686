/* Transactional random updates on a Berkeley DB btree or hash database: the
 * Moneta-D papers' Berkeley DB workload (SPEC §3.5: "Berkeley-DB hash/btree").
 *
 *   bdb_updates DIR btree|hash RECORDS TRANSACTIONS SEED
 *
 * Creates an environment in DIR (transactions, logging, locking, a memory
 * pool), loads RECORDS records of 128 B, then runs TRANSACTIONS transactions,
 * each updating 4 random records, committed durably. Prints the transaction
 * rate and a checksum of the final contents, so a run through the Moneta shim
 * and one through the kernel can be compared. Exit 1 on any error. */
#include <db.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VALUE_BYTES 128
#define UPDATES_PER_TXN 4

static uint64_t rng_state;
static uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int check(int ret, const char *what) {
    if (ret != 0) {
        fprintf(stderr, "bdb_updates: %s: %s\n", what, db_strerror(ret));
        exit(1);
    }
    return ret;
}

static void fill(unsigned char *value, uint32_t key, uint64_t version) {
    for (int i = 0; i < VALUE_BYTES; i++)
        value[i] = (unsigned char)(key * 31 + version * 7 + i);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: bdb_updates DIR btree|hash RECORDS TRANSACTIONS SEED\n");
        return 2;
    }
    const char *dir = argv[1];
    DBTYPE type = strcmp(argv[2], "hash") == 0 ? DB_HASH : DB_BTREE;
    uint32_t records = (uint32_t)strtoul(argv[3], NULL, 10);
    uint64_t transactions = strtoull(argv[4], NULL, 10);
    rng_state = strtoull(argv[5], NULL, 10) | 1;
    if (records == 0) {
        fprintf(stderr, "bdb_updates: RECORDS must be positive\n");
        return 2;
    }

    DB_ENV *env;
    check(db_env_create(&env, 0), "db_env_create");
    check(env->set_cachesize(env, 0, 8 << 20, 1), "set_cachesize");
    check(env->open(env, dir,
                    DB_CREATE | DB_INIT_TXN | DB_INIT_LOG | DB_INIT_LOCK | DB_INIT_MPOOL |
                        DB_RECOVER,
                    0644),
          "env->open");
    DB *db;
    check(db_create(&db, env, 0), "db_create");
    check(db->open(db, NULL, "updates.db", NULL, type, DB_CREATE | DB_AUTO_COMMIT, 0644),
          "db->open");

    unsigned char value[VALUE_BYTES];
    DBT key, data;
    uint32_t k;
    memset(&key, 0, sizeof key);
    memset(&data, 0, sizeof data);
    key.data = &k;
    key.size = sizeof k;
    data.data = value;
    data.size = VALUE_BYTES;

    DB_TXN *txn;
    check(env->txn_begin(env, NULL, &txn, 0), "txn_begin (load)");
    for (k = 0; k < records; k++) {
        fill(value, k, 0);
        check(db->put(db, txn, &key, &data, 0), "put (load)");
    }
    check(txn->commit(txn, 0), "commit (load)");

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t t = 1; t <= transactions; t++) {
        check(env->txn_begin(env, NULL, &txn, 0), "txn_begin");
        for (int u = 0; u < UPDATES_PER_TXN; u++) {
            k = (uint32_t)(next_random() % records);
            fill(value, k, t);
            check(db->put(db, txn, &key, &data, 0), "put");
        }
        check(txn->commit(txn, 0), "commit");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;

    /* Checksum the whole database in key order (FNV-1a over key and value). */
    uint64_t sum = 1469598103934665603ULL;
    DBC *cursor;
    check(db->cursor(db, NULL, &cursor, 0), "cursor");
    uint64_t seen = 0;
    DBT ck, cv;
    uint32_t *order = calloc(records, sizeof *order);
    memset(&ck, 0, sizeof ck);
    memset(&cv, 0, sizeof cv);
    while (cursor->get(cursor, &ck, &cv, DB_NEXT) == 0) {
        uint32_t kk;
        memcpy(&kk, ck.data, sizeof kk);
        if (kk >= records || cv.size != VALUE_BYTES) {
            fprintf(stderr, "bdb_updates: unexpected record\n");
            return 1;
        }
        /* Hash order differs from btree order: combine per key, order-free. */
        uint64_t h = 1469598103934665603ULL ^ kk;
        for (uint32_t i = 0; i < cv.size; i++)
            h = (h ^ ((unsigned char *)cv.data)[i]) * 1099511628211ULL;
        sum += h;
        order[kk]++;
        seen++;
    }
    cursor->close(cursor);
    for (uint32_t i = 0; i < records; i++)
        if (order[i] != 1) {
            fprintf(stderr, "bdb_updates: key %u seen %u times\n", i, order[i]);
            return 1;
        }
    free(order);
    check(db->close(db, 0), "db->close");
    check(env->close(env, 0), "env->close");
    printf("{\"type\":\"%s\",\"records\":%u,\"transactions\":%llu,\"seconds\":%.6f,"
           "\"transactions_per_s\":%.1f,\"checksum\":\"%016llx\",\"records_seen\":%llu}\n",
           type == DB_HASH ? "hash" : "btree", records, (unsigned long long)transactions,
           seconds, transactions / seconds, (unsigned long long)sum,
           (unsigned long long)seen);
    return 0;
}
