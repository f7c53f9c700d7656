/* The interner of string block ids: text -> 64-bit key, exactly as ids.py defines keys.
 *
 * A decimal text (-?(0|[1-9][0-9]*)) whose value lies in [-2^62, 2^62) is that integer;
 * any other text is base + its index among the distinct texts in first-seen order. The
 * texts live in one arena (their bytes, back to back) with an open-addressing table of
 * indexes, about 20 bytes per distinct text beyond its bytes: a fraction of what a
 * Python dict of str objects holds. */
#include "internal.h"

#define KEY_LIMIT ((int64_t)1 << 62)

struct sim_interner {
    char *arena;
    size_t used, cap;
    int64_t *start;         /* count + 1 offsets into the arena */
    uint32_t *hash;         /* count hashes (low bits), for growing the table */
    int64_t count, slots;   /* names; capacity of start / hash */
    uint32_t *table;        /* index + 1 of a name, 0 empty; table_cap a power of two */
    size_t table_cap;
};

static uint64_t hash_bytes(const unsigned char *p, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

sim_interner *sim_interner_new(void) {
    sim_interner *x = calloc(1, sizeof(*x));
    if (!x) return NULL;
    x->table_cap = 1024;
    x->table = calloc(x->table_cap, sizeof(uint32_t));
    x->slots = 256;
    x->start = malloc((size_t)(x->slots + 1) * sizeof(int64_t));
    x->hash = malloc((size_t)x->slots * sizeof(uint32_t));
    x->cap = 4096;
    x->arena = malloc(x->cap);
    if (!x->table || !x->start || !x->hash || !x->arena) {
        sim_interner_free(x);
        return NULL;
    }
    x->start[0] = 0;
    return x;
}

void sim_interner_free(sim_interner *x) {
    if (!x) return;
    free(x->arena);
    free(x->start);
    free(x->hash);
    free(x->table);
    free(x);
}

int64_t sim_interner_count(const sim_interner *x) { return x->count; }

int64_t sim_interner_bytes(const sim_interner *x) {
    return (int64_t)(x->cap + (size_t)x->slots * 12 + x->table_cap * 4);
}

int64_t sim_interner_name(const sim_interner *x, int64_t index, char *out, int64_t cap) {
    if (index < 0 || index >= x->count) return SIM_EINVAL;
    int64_t n = x->start[index + 1] - x->start[index];
    if (out && cap >= n) memcpy(out, x->arena + x->start[index], (size_t)n);
    return n;
}

static int grow_table(sim_interner *x) {
    size_t cap = x->table_cap * 2;
    uint32_t *table = calloc(cap, sizeof(uint32_t));
    if (!table) return SIM_ENOMEM;
    for (int64_t i = 0; i < x->count; i++) {
        size_t at = (size_t)x->hash[i] & (cap - 1);
        while (table[at]) at = (at + 1) & (cap - 1);
        table[at] = (uint32_t)(i + 1);
    }
    free(x->table);
    x->table = table;
    x->table_cap = cap;
    return SIM_OK;
}

/* The integer of a decimal text in range, as 1; 0 when the text is not one. */
static int decimal_key(const char *p, int64_t n, int64_t *key) {
    int negative = n > 0 && p[0] == '-';
    const char *d = p + negative;
    int64_t digits = n - negative;
    if (digits < 1 || digits > 19 || (digits > 1 && d[0] == '0')) return 0;
    uint64_t v = 0;
    for (int64_t i = 0; i < digits; i++) {
        if (d[i] < '0' || d[i] > '9') return 0;
        v = v * 10 + (uint64_t)(d[i] - '0');
    }
    if (negative ? v > (uint64_t)KEY_LIMIT : v >= (uint64_t)KEY_LIMIT) return 0;
    *key = negative ? -(int64_t)v : (int64_t)v;
    return 1;
}

int64_t sim_intern(sim_interner *x, const char *text, const int64_t *ends, int64_t n,
                   int64_t base, int64_t *keys) {
    int64_t from = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *p = text + from;
        int64_t len = ends[i] - from;
        from = ends[i];
        if (len < 0) return SIM_EINVAL;
        if (decimal_key(p, len, &keys[i])) continue;
        uint32_t h = (uint32_t)hash_bytes((const unsigned char *)p, len);
        size_t at = (size_t)h & (x->table_cap - 1);
        int64_t found = -1;
        while (x->table[at]) {
            int64_t k = (int64_t)x->table[at] - 1;
            if (x->hash[k] == h && x->start[k + 1] - x->start[k] == len &&
                memcmp(x->arena + x->start[k], p, (size_t)len) == 0) {
                found = k;
                break;
            }
            at = (at + 1) & (x->table_cap - 1);
        }
        if (found < 0) {
            if (x->count >= 0xfffffffeLL) return SIM_EINVAL;
            if (x->count == x->slots) {
                int64_t slots = x->slots + x->slots / 2;  /* 1.5x: less slack than 2x */
                int64_t *start = realloc(x->start, (size_t)(slots + 1) * sizeof(int64_t));
                if (!start) return SIM_ENOMEM;
                x->start = start;
                uint32_t *hash = realloc(x->hash, (size_t)slots * sizeof(uint32_t));
                if (!hash) return SIM_ENOMEM;
                x->hash = hash;
                x->slots = slots;
            }
            if (x->used + (size_t)len > x->cap) {
                size_t cap = x->cap + x->cap / 2;
                while (x->used + (size_t)len > cap) cap += cap / 2;
                char *arena = realloc(x->arena, cap);
                if (!arena) return SIM_ENOMEM;
                x->arena = arena;
                x->cap = cap;
            }
            memcpy(x->arena + x->used, p, (size_t)len);
            x->used += (size_t)len;
            found = x->count++;
            x->start[x->count] = (int64_t)x->used;
            x->hash[found] = h;
            x->table[at] = (uint32_t)(found + 1);
            if ((size_t)x->count * 4 > x->table_cap * 3) { /* load at most 3/4 */
                int rc = grow_table(x);
                if (rc) return rc;
            }
        }
        keys[i] = base + found;
    }
    return n;
}
