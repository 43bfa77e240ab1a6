/* The Swift form of Swift's metadata, both ways, in C (see xattrblob.py).
 *
 * Reading: a GET of an object whose xattrs are stored in the Swift form decodes them once:
 * the payload is inflated, the dict's items pickled again (protocol 2, as Swift does),
 * the pickle's CRC-32 checked and its MD5 given as the checksum xattr. In Python that is
 * a zlib object, a dict built, pickle.dumps, zlib.crc32 and hashlib.md5: ~20 us in a
 * loop, 100 us and more inside the daemon, where every request starts in caches the
 * object server and the kernel have just used. Here it is one pass into one buffer.
 *
 * Writing: the compressor reads the pickle as swiftpickle.py does (a stack machine that
 * holds only what the input spells out and calls nothing), writes the items, pickles
 * them again and keeps them only if that gives back the pickle byte for byte.
 *
 * The bytes must be those pickle.dumps(dict, 2) gives for the dict xattrblob._read_items
 * builds (tests/unit/test_swiftform.py compares them): under protocol 2 CPython pickles
 * each bytes object as a call of _codecs.encode(str, "latin1"), b"" as bytes(), and
 * memoizes by object identity: the globals, the string "latin1", every string, tuple and
 * bytes object gets a memo slot (BINPUT), and an object met again is fetched from its
 * slot (BINGET). The only objects of such a dict met twice are CPython's singletons, b""
 * and the 256 bytes of length one: a slice of that length is one of them. Whatever else
 * the items hold is a new object each time.
 *
 * Malformed items raise ValueError, and so does a pickle whose CRC-32 is not the one
 * stored: the caller answers EIO, as the Python path does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define BATCHSIZE 1000 /* items per MARK ... SETITEMS, as CPython's pickler writes them */
#define RAW 0
#define HEX 1
#define STAMP 2

static const char METADATA[] = "user.swift.metadata";
static const char CHECKSUM[] = "user.swift.metadata_checksum";

/* ---- a growing output buffer ---- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} Out;

static int reserve(Out *o, size_t n) {
    if (o->len + n <= o->cap)
        return 0;
    size_t cap = o->cap ? o->cap : 1024;
    while (cap < o->len + n)
        cap *= 2;
    unsigned char *p = PyMem_Realloc(o->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    return 0;
}

static int put(Out *o, const void *data, size_t n) {
    if (n == 0)
        return 0; /* memcpy may not be given NULL, even for nothing (the empty value put_xattr reserves) */
    if (reserve(o, n) < 0)
        return -1;
    memcpy(o->p + o->len, data, n);
    o->len += n;
    return 0;
}

static int put_byte(Out *o, unsigned char c) { return put(o, &c, 1); }

static int put_u32(Out *o, uint32_t v) {
    unsigned char b[4] = {v & 0xFF, v >> 8 & 0xFF, v >> 16 & 0xFF, v >> 24};
    return put(o, b, 4);
}

/* ---- reading the items ---- */

typedef struct {
    const unsigned char *b;
    size_t len, pos;
} In;

static int malformed(void) {
    PyErr_SetString(PyExc_ValueError, "the Swift form's items are malformed");
    return -1;
}

static int read_varint(In *in, uint64_t *v) {
    uint64_t n = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (in->pos >= in->len)
            return malformed();
        unsigned char c = in->b[in->pos++];
        n |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) {
            *v = n;
            return 0;
        }
    }
    return malformed();
}

static int read_span(In *in, uint64_t n, const unsigned char **at) {
    if (n > in->len - in->pos)
        return malformed();
    *at = in->b + in->pos;
    in->pos += n;
    return 0;
}

/* ---- the pickler ---- */

typedef struct {
    Out *o;
    uint32_t next;                             /* the next memo slot */
    int64_t codecs_encode, bytes_type, latin1; /* memo slots, -1 until written */
    int64_t empty, single[256];                /* b"" and the one-byte singletons */
} Pickler;

static int memo_put(Pickler *pk, int64_t *slot) {
    uint32_t idx = pk->next++;
    if (slot)
        *slot = idx;
    if (idx < 256) {
        unsigned char op[2] = {'q', (unsigned char)idx};
        return put(pk->o, op, 2);
    }
    return put_byte(pk->o, 'r') < 0 ? -1 : put_u32(pk->o, idx);
}

static int memo_get(Pickler *pk, int64_t idx) {
    if (idx < 256) {
        unsigned char op[2] = {'h', (unsigned char)idx};
        return put(pk->o, op, 2);
    }
    return put_byte(pk->o, 'j') < 0 ? -1 : put_u32(pk->o, (uint32_t)idx);
}

/* A global or the string "latin1": written once, fetched from its slot after. */
#define GLOBAL(pk, slot, spelled) global(pk, slot, spelled, sizeof spelled - 1)
static int global(Pickler *pk, int64_t *slot, const char *spelled, size_t n) {
    if (*slot >= 0)
        return memo_get(pk, *slot);
    return put(pk->o, spelled, n) < 0 ? -1 : memo_put(pk, slot);
}

/* A bytes object that is not a singleton: _codecs.encode(<its latin-1 string>, "latin1"). */
static int save_new_bytes(Pickler *pk, const unsigned char *s, size_t n, int64_t *slot) {
    if (GLOBAL(pk, &pk->codecs_encode, "c_codecs\nencode\n") < 0)
        return -1;
    size_t utf8 = n;
    for (size_t i = 0; i < n; i++)
        utf8 += s[i] >> 7;
    if (utf8 > UINT32_MAX)
        return malformed();
    if (reserve(pk->o, 5 + utf8) < 0 || put_byte(pk->o, 'X') < 0 || put_u32(pk->o, (uint32_t)utf8) < 0)
        return -1;
    unsigned char *w = pk->o->p + pk->o->len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x80) {
            *w++ = s[i];
        } else {
            *w++ = 0xC0 | s[i] >> 6;
            *w++ = 0x80 | (s[i] & 0x3F);
        }
    }
    pk->o->len += utf8;
    if (memo_put(pk, NULL) < 0 || GLOBAL(pk, &pk->latin1, "X\x06\x00\x00\x00latin1") < 0)
        return -1;
    if (put_byte(pk->o, 0x86) < 0 || memo_put(pk, NULL) < 0 || put_byte(pk->o, 'R') < 0)
        return -1;
    return memo_put(pk, slot);
}

static int save_bytes(Pickler *pk, const unsigned char *s, size_t n) {
    if (n == 0) {
        if (pk->empty >= 0)
            return memo_get(pk, pk->empty);
        if (GLOBAL(pk, &pk->bytes_type, "c__builtin__\nbytes\n") < 0 || put(pk->o, ")R", 2) < 0)
            return -1;
        return memo_put(pk, &pk->empty);
    }
    if (n == 1) {
        if (pk->single[s[0]] >= 0)
            return memo_get(pk, pk->single[s[0]]);
        return save_new_bytes(pk, s, 1, &pk->single[s[0]]);
    }
    return save_new_bytes(pk, s, n, NULL);
}

/* A value of the items, as xattrblob._read_value gives it back. */
static int save_value(Pickler *pk, In *in) {
    uint64_t n;
    const unsigned char *v;
    if (read_varint(in, &n) < 0 || read_span(in, n >> 2, &v) < 0)
        return -1;
    int kind = n & 3;
    n >>= 2;
    if (kind == HEX) {
        static const char digits[] = "0123456789abcdef";
        unsigned char small[128], *hex = 2 * n <= sizeof small ? small : PyMem_Malloc(2 * n);
        if (hex == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            hex[2 * i] = digits[v[i] >> 4];
            hex[2 * i + 1] = digits[v[i] & 15];
        }
        int r = save_bytes(pk, hex, 2 * n);
        if (hex != small)
            PyMem_Free(hex);
        return r;
    }
    if (kind == STAMP) {
        if (n != 7)
            return malformed();
        unsigned long long t = 0;
        for (int i = 0; i < 7; i++)
            t = t << 8 | v[i];
        char digits[32], stamp[33];
        int len = snprintf(digits, sizeof digits, "%015llu", t);
        memcpy(stamp, digits, 10);
        stamp[10] = '.';
        memcpy(stamp + 11, digits + 10, len - 10);
        return save_bytes(pk, (unsigned char *)stamp, len + 1);
    }
    return save_bytes(pk, v, n); /* RAW, and the unused kind 3, which reads as RAW */
}

/* The pickle of the dict the items at in->pos hold, appended to o; in->pos moves past them. */
static int pickle_items_into(In *in, Out *o) {
    Pickler pk = {.o = o, .codecs_encode = -1, .bytes_type = -1, .latin1 = -1, .empty = -1};
    memset(pk.single, 0xFF, sizeof pk.single); /* all -1 */
    uint64_t count;
    if (read_varint(in, &count) < 0 || put(o, "\x80\x02}", 3) < 0 || memo_put(&pk, NULL) < 0)
        return -1;
    uint64_t done = 0;
    int batch = count > 1; /* one item is written with SETITEM, more in batches */
    do {
        if (batch && put_byte(o, '(') < 0)
            return -1;
        uint64_t i = 0;
        for (; i < BATCHSIZE && done < count; i++, done++) {
            uint64_t n;
            const unsigned char *k;
            if (read_varint(in, &n) < 0 || read_span(in, n, &k) < 0 || save_bytes(&pk, k, n) < 0 ||
                save_value(&pk, in) < 0)
                return -1;
        }
        if (count && put_byte(o, batch ? 'u' : 's') < 0)
            return -1;
        if (i < BATCHSIZE)
            break;
    } while (1); /* CPython ends a multiple of BATCHSIZE with an empty batch */
    return put_byte(o, '.');
}

/* ---- the Swift form's items of a pickle ---- */

/* The items as xattrblob._items writes them: a value's kind in the low two bits of its length. */
static int put_varint(Out *o, uint64_t n) {
    unsigned char b[10];
    int i = 0;
    for (; n > 0x7F; n >>= 7)
        b[i++] = (n & 0x7F) | 0x80;
    b[i++] = (unsigned char)n;
    return put(o, b, i);
}

static int is_digits(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int put_value(Out *o, const unsigned char *v, size_t n) {
    if (n == 16 && v[10] == '.' && is_digits(v, 10) && is_digits(v + 11, 5)) {
        unsigned long long t = 0;
        for (int i = 0; i < 16; i++)
            if (i != 10)
                t = t * 10 + (v[i] - '0');
        unsigned char b[7];
        for (int i = 6; i >= 0; i--, t >>= 8)
            b[i] = t & 0xFF;
        return put_varint(o, 7 << 2 | STAMP) < 0 ? -1 : put(o, b, 7);
    }
    int hex = n > 0 && n % 2 == 0;
    for (size_t i = 0; hex && i < n; i++)
        hex = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f');
    if (!hex)
        return put_varint(o, (uint64_t)n << 2 | RAW) < 0 ? -1 : put(o, v, n);
    if (put_varint(o, (uint64_t)(n / 2) << 2 | HEX) < 0 || reserve(o, n / 2) < 0)
        return -1;
    for (size_t i = 0; i < n; i += 2) {
        int hi = v[i] <= '9' ? v[i] - '0' : v[i] - 'a' + 10, lo = v[i + 1] <= '9' ? v[i + 1] - '0' : v[i + 1] - 'a' + 10;
        o->p[o->len++] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

/* What the pickle's stack holds: spans of the input (a string's UTF-8) or of the bytes
 * decoded so far (a bytes object's). */
enum { T_DICT, T_ENCODE, T_BYTES_TYPE, T_STR, T_PAIR, T_EMPTY_TUPLE, T_BYTES };

typedef struct {
    unsigned char type;
    uint32_t off, len, off2, len2; /* T_PAIR: two strings */
} Obj;

typedef struct {
    Obj *v;
    size_t n, cap;
} Objs;

static int push(Objs *s, Obj o) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        Obj *v = PyMem_Realloc(s->v, cap * sizeof *v);
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = o;
    return 0;
}

typedef struct {
    const unsigned char *b;
    size_t len;
    Objs stack, memo, marks, pairs; /* marks: T_DICT entries whose `off` is a stack depth; pairs: key, value */
    Out bytes;                      /* the bytes objects' contents */
    int dicts;                      /* EMPTY_DICTs read */
} Reader;

/* _codecs.encode(s, "latin1") of the UTF-8 string at off: 1 and the bytes, 0 if it is not
 * latin-1 (or not UTF-8), -1 on an error (set). */
static int latin1(Reader *r, uint32_t off, uint32_t len, Obj *out) {
    if (reserve(&r->bytes, len) < 0)
        return -1;
    const unsigned char *u = r->b + off;
    size_t start = r->bytes.len, n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = u[i];
        if (c >= 0x80) {
            if ((c != 0xC2 && c != 0xC3) || i + 1 >= len || (u[i + 1] & 0xC0) != 0x80)
                return 0;
            c = (unsigned char)((c & 0x1F) << 6 | (u[++i] & 0x3F));
        }
        r->bytes.p[start + n++] = c;
    }
    r->bytes.len += n;
    *out = (Obj){T_BYTES, (uint32_t)start, (uint32_t)n};
    return 1;
}

static int same_bytes(Reader *r, Obj a, Obj b) {
    return a.len == b.len && memcmp(r->bytes.p + a.off, r->bytes.p + b.off, a.len) == 0;
}

/* Whether a key comes twice in r->pairs (1), or not (0); -1 on an error (set). */
static int key_twice(Reader *r) {
    size_t n = r->pairs.n / 2, cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint32_t *slots = PyMem_Calloc(cap, sizeof *slots); /* a key's index + 1 */
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int twice = 0;
    for (size_t i = 0; i < n && !twice; i++) {
        Obj k = r->pairs.v[2 * i];
        uint32_t h = 2166136261u; /* FNV-1a */
        for (uint32_t j = 0; j < k.len; j++)
            h = (h ^ r->bytes.p[k.off + j]) * 16777619u;
        size_t at = h & (cap - 1);
        for (; slots[at] && !twice; at = (at + 1) & (cap - 1))
            twice = same_bytes(r, r->pairs.v[2 * (slots[at] - 1)], k);
        slots[at] = (uint32_t)i + 1;
    }
    PyMem_Free(slots);
    return twice;
}

/* Read a pickle as swiftpickle.load_metadata does, the dict's items into r->pairs: 1 if
 * it is a dict of bytes with no key twice, 0 if not, -1 on an error (set). Memo slots
 * must come in order, as every pickler writes them: anything else cannot pickle back. */
static int read_pickle(Reader *r) {
    const unsigned char *b = r->b;
    size_t pos = 2, end = r->len;
    if (end < 2 || b[0] != 0x80 || b[1] != 2)
        return 0;
#define NEED(n)                                                                                                  \
    if ((n) > end - pos)                                                                                         \
    return 0
#define POP(o)                                                                                                   \
    if (r->stack.n == 0 || (r->marks.n && r->stack.n <= r->marks.v[r->marks.n - 1].off))                        \
        return 0;                                                                                                \
    o = r->stack.v[--r->stack.n]
    while (pos < end) {
        unsigned char op = b[pos++];
        Obj o, o2;
        uint32_t idx;
        switch (op) {
        case 'q':
        case 'r':
            NEED(op == 'q' ? 1u : 4u);
            idx = op == 'q' ? b[pos] : (uint32_t)(b[pos] | b[pos + 1] << 8 | b[pos + 2] << 16 | (uint32_t)b[pos + 3] << 24);
            pos += op == 'q' ? 1 : 4;
            if (idx != r->memo.n || r->stack.n == 0)
                return 0;
            if (push(&r->memo, r->stack.v[r->stack.n - 1]) < 0)
                return -1;
            break;
        case 'h':
        case 'j':
            NEED(op == 'h' ? 1u : 4u);
            idx = op == 'h' ? b[pos] : (uint32_t)(b[pos] | b[pos + 1] << 8 | b[pos + 2] << 16 | (uint32_t)b[pos + 3] << 24);
            pos += op == 'h' ? 1 : 4;
            if (idx >= r->memo.n)
                return 0;
            o = r->memo.v[idx];
            if (o.type == T_DICT)
                return 0; /* the dict twice on the stack: it can never end there alone */
            if (push(&r->stack, o) < 0)
                return -1;
            break;
        case 'X': {
            NEED(4u);
            uint32_t n = b[pos] | b[pos + 1] << 8 | b[pos + 2] << 16 | (uint32_t)b[pos + 3] << 24;
            pos += 4;
            NEED(n);
            if (push(&r->stack, (Obj){T_STR, (uint32_t)pos, n}) < 0)
                return -1;
            pos += n;
            break;
        }
        case 0x86:
            POP(o2);
            POP(o);
            if (o.type != T_STR || o2.type != T_STR)
                return 0; /* only _codecs.encode's arguments are ever a tuple here */
            if (push(&r->stack, (Obj){T_PAIR, o.off, o.len, o2.off, o2.len}) < 0)
                return -1;
            break;
        case ')':
            if (push(&r->stack, (Obj){T_EMPTY_TUPLE}) < 0)
                return -1;
            break;
        case 'R':
            POP(o2);
            POP(o);
            if (o.type == T_ENCODE && o2.type == T_PAIR && o2.len2 == 6 && memcmp(b + o2.off2, "latin1", 6) == 0) {
                int got = latin1(r, o2.off, o2.len, &o);
                if (got <= 0)
                    return got;
            } else if (o.type == T_BYTES_TYPE && o2.type == T_EMPTY_TUPLE) {
                o = (Obj){T_BYTES, 0, 0};
            } else {
                return 0;
            }
            if (push(&r->stack, o) < 0)
                return -1;
            break;
        case 'c': {
            static const char encode[] = "_codecs\nencode\n", bytes_type[] = "__builtin__\nbytes\n";
            if (end - pos >= sizeof encode - 1 && memcmp(b + pos, encode, sizeof encode - 1) == 0) {
                pos += sizeof encode - 1;
                o = (Obj){T_ENCODE};
            } else if (end - pos >= sizeof bytes_type - 1 && memcmp(b + pos, bytes_type, sizeof bytes_type - 1) == 0) {
                pos += sizeof bytes_type - 1;
                o = (Obj){T_BYTES_TYPE};
            } else {
                return 0;
            }
            if (push(&r->stack, o) < 0)
                return -1;
            break;
        }
        case '}':
            if (r->dicts++)
                return 0; /* a second dict: only one can end on the stack, and nothing takes one */
            if (push(&r->stack, (Obj){T_DICT}) < 0)
                return -1;
            break;
        case '(':
            if (push(&r->marks, (Obj){T_DICT, (uint32_t)r->stack.n}) < 0)
                return -1;
            break;
        case 'u':
        case 's': {
            size_t at;
            if (op == 'u') {
                if (r->marks.n == 0)
                    return 0;
                at = r->marks.v[--r->marks.n].off;
            } else {
                if (r->stack.n < 2 || (r->marks.n && r->stack.n - 2 < r->marks.v[r->marks.n - 1].off))
                    return 0;
                at = r->stack.n - 2;
            }
            if (at == 0 || at > r->stack.n || (r->stack.n - at) % 2 || r->stack.v[at - 1].type != T_DICT)
                return 0;
            for (size_t i = at; i < r->stack.n; i += 2) {
                Obj k = r->stack.v[i], v = r->stack.v[i + 1];
                if (k.type != T_BYTES || v.type != T_BYTES)
                    return 0;
                if (push(&r->pairs, k) < 0 || push(&r->pairs, v) < 0)
                    return -1;
            }
            r->stack.n = at;
            break;
        }
        case '.':
            if (pos != end || r->marks.n || r->stack.n != 1 || r->stack.v[0].type != T_DICT)
                return 0;
            int twice = key_twice(r);
            return twice < 0 ? -1 : !twice; /* a key set twice leaves a dict that pickles otherwise */
        default:
            return 0;
        }
    }
    return 0;
#undef NEED
#undef POP
}

/* ---- MD5 (RFC 1321) ----
 * Here rather than through hashlib: that is OpenSSL's EVP machinery, a cold path of its
 * own on every GET (hashlib.md5 of Swift's pickle took 20 us inside the daemon, against
 * 3.3 in a loop; measured 2026-11-27). */

static uint32_t md5_k[64];
static const unsigned char md5_s[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                        5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                        4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                        6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

static void md5_block(uint32_t h[4], const unsigned char *b) {
    uint32_t m[16];
    for (int i = 0; i < 16; i++)
        m[i] = b[4 * i] | b[4 * i + 1] << 8 | b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; i++) {
        uint32_t f;
        int g;
        if (i < 16) {
            f = (bb & c) | (~bb & d);
            g = i;
        } else if (i < 32) {
            f = (d & bb) | (~d & c);
            g = (5 * i + 1) & 15;
        } else if (i < 48) {
            f = bb ^ c ^ d;
            g = (3 * i + 5) & 15;
        } else {
            f = c ^ (bb | ~d);
            g = (7 * i) & 15;
        }
        f += a + md5_k[i] + m[g];
        a = d;
        d = c;
        c = bb;
        bb += f << md5_s[i] | f >> (32 - md5_s[i]);
    }
    h[0] += a;
    h[1] += bb;
    h[2] += c;
    h[3] += d;
}

/* The MD5 of data as 32 lowercase hex digits, as hashlib's hexdigest() gives it. */
static void md5_hex(const unsigned char *data, size_t n, char out[32]) {
    uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
    size_t whole = n & ~(size_t)63;
    for (size_t i = 0; i < whole; i += 64)
        md5_block(h, data + i);
    unsigned char tail[128] = {0};
    size_t rest = n - whole, tail_len = rest < 56 ? 64 : 128;
    memcpy(tail, data + whole, rest);
    tail[rest] = 0x80;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++)
        tail[tail_len - 8 + i] = bits >> (8 * i) & 0xFF;
    for (size_t i = 0; i < tail_len; i += 64)
        md5_block(h, tail + i);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        unsigned char byte = h[i / 4] >> (8 * (i % 4)) & 0xFF;
        out[2 * i] = digits[byte >> 4];
        out[2 * i + 1] = digits[byte & 15];
    }
}

/* ---- the module ---- */

/* One xattr's header in a plain packed blob: <u16 name length><u32 value length>. */
static void xattr_head(unsigned char *h, size_t name_len, size_t value_len) {
    unsigned char v[6] = {name_len & 0xFF, name_len >> 8, value_len & 0xFF, value_len >> 8 & 0xFF,
                          value_len >> 16 & 0xFF, value_len >> 24 & 0xFF};
    memcpy(h, v, 6);
}

static int put_xattr(Out *o, const char *name, size_t name_len, const void *value, size_t value_len) {
    if (reserve(o, 6 + name_len + value_len) < 0)
        return -1;
    xattr_head(o->p + o->len, name_len, value_len);
    o->len += 6;
    return put(o, name, name_len) < 0 ? -1 : put(o, value, value_len);
}

/* The plain blob of a payload: <crc32 of the pickle><items><flags><the xattrs after>. */
static PyObject *decode_payload(const unsigned char *b, size_t len) {
    if (len < 4) {
        malformed();
        return NULL;
    }
    In in = {b, len, 4};
    Out o = {0};
    PyObject *r = NULL;
    size_t meta_at = 6 + sizeof METADATA - 1;
    if (put_xattr(&o, METADATA, sizeof METADATA - 1, NULL, 0) < 0 || pickle_items_into(&in, &o) < 0)
        goto done;
    size_t meta_len = o.len - meta_at;
    if (meta_len > UINT32_MAX || in.pos >= len) {
        malformed();
        goto done;
    }
    uint32_t made = (uint32_t)crc32(0L, o.p + meta_at, (uInt)meta_len);
    uint32_t crc = b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
    if (made != crc) {
        PyErr_Format(PyExc_ValueError,
                     "the pickle made again has CRC %08x, stored %08x: "
                     "Swift's metadata pickles differently here than when it was stored",
                     made, crc);
        goto done;
    }
    xattr_head(o.p, sizeof METADATA - 1, meta_len);
    if (b[in.pos++] & 1) { /* the checksum xattr follows: the pickle's MD5 */
        char sum[32];
        md5_hex(o.p + meta_at, meta_len, sum);
        if (put_xattr(&o, CHECKSUM, sizeof CHECKSUM - 1, sum, 32) < 0)
            goto done;
    }
    if (put(&o, b + in.pos, len - in.pos) == 0)
        r = PyBytes_FromStringAndSize((char *)o.p, o.len);
done:
    PyMem_Free(o.p);
    return r;
}

/* One inflate state for every call, reset each time: a new one (zlib.decompressobj) is
 * ~40 KiB of memory to allocate and touch per GET. Calls hold the GIL: one at a time. */
static z_stream zs;
static int zs_ready;

/* Raw-inflate data against zdict into o: what zlib.decompressobj(-15, zdict).decompress
 * gives (a stream cut short gives what it holds; bytes after its end are ignored). */
static int inflate_into(const unsigned char *data, size_t len, const unsigned char *zdict, size_t zlen, Out *o) {
    if (len > UINT_MAX || zlen > UINT_MAX) {
        PyErr_SetString(PyExc_ValueError, "too long to inflate");
        return -1;
    }
    int ret = zs_ready ? inflateReset(&zs) : inflateInit2(&zs, -15);
    if (ret != Z_OK) {
        PyErr_Format(PyExc_ValueError, "inflate: %s", zs.msg ? zs.msg : "cannot start");
        return -1;
    }
    zs_ready = 1;
    if (inflateSetDictionary(&zs, zdict, (uInt)zlen) != Z_OK) {
        PyErr_SetString(PyExc_ValueError, "inflate: the dictionary is refused");
        return -1;
    }
    zs.next_in = (unsigned char *)data;
    zs.avail_in = (uInt)len;
    do {
        if (reserve(o, 4 * len + 256) < 0)
            return -1;
        zs.next_out = o->p + o->len;
        zs.avail_out = (uInt)(o->cap - o->len);
        ret = inflate(&zs, Z_SYNC_FLUSH);
        o->len = o->cap - zs.avail_out;
    } while (ret == Z_OK && zs.avail_out == 0);
    if (ret != Z_OK && ret != Z_STREAM_END && ret != Z_BUF_ERROR) {
        PyErr_Format(PyExc_ValueError, "inflate: %s", zs.msg ? zs.msg : "invalid data");
        return -1;
    }
    return 0;
}

static PyObject *plain_blob(PyObject *self, PyObject *args) {
    Py_buffer data, zdict;
    if (!PyArg_ParseTuple(args, "y*y*:plain_blob", &data, &zdict))
        return NULL;
    Out payload = {0};
    PyObject *r = NULL;
    if (inflate_into(data.buf, (size_t)data.len, zdict.buf, (size_t)zdict.len, &payload) == 0)
        r = decode_payload(payload.p, payload.len);
    PyMem_Free(payload.p);
    PyBuffer_Release(&data);
    PyBuffer_Release(&zdict);
    return r;
}

/* The Swift form's items of the pairs read, if they pickle back to the pickle read: 1 and
 * the items, 0 if not, -1 on an error (set). */
static int items_of(Reader *r, Out *items) {
    if (put_varint(items, r->pairs.n / 2) < 0)
        return -1;
    for (size_t i = 0; i < r->pairs.n; i += 2) {
        Obj k = r->pairs.v[i], v = r->pairs.v[i + 1];
        if (put_varint(items, k.len) < 0 || put(items, r->bytes.p + k.off, k.len) < 0 ||
            put_value(items, r->bytes.p + v.off, v.len) < 0)
            return -1;
    }
    Out again = {0};
    In in = {items->p, items->len, 0};
    int got = pickle_items_into(&in, &again) < 0 ? -1 : again.len == r->len && memcmp(again.p, r->b, r->len) == 0;
    PyMem_Free(again.p);
    return got;
}

static PyObject *swift_items(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {.b = view.buf, .len = (size_t)view.len};
    Out items = {0};
    int got = view.len <= UINT32_MAX ? read_pickle(&r) : 0;
    if (got == 1)
        got = items_of(&r, &items);
    PyObject *result = got < 0 ? NULL : got ? PyBytes_FromStringAndSize((char *)items.p, items.len) : Py_NewRef(Py_None);
    PyMem_Free(r.stack.v);
    PyMem_Free(r.memo.v);
    PyMem_Free(r.marks.v);
    PyMem_Free(r.pairs.v);
    PyMem_Free(r.bytes.p);
    PyMem_Free(items.p);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *md5_hexdigest(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    char sum[32];
    md5_hex(view.buf, (size_t)view.len, sum);
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize(sum, 32);
}

static PyMethodDef methods[] = {
    {"plain_blob", plain_blob, METH_VARARGS,
     "plain_blob(deflated, zdict) -> the plain packed xattrs a Swift form payload, raw-deflated against zdict, "
     "keeps (ValueError if it does not decode)."},
    {"swift_items", swift_items, METH_O,
     "swift_items(pickle) -> the Swift form's items of a protocol-2 pickle of a dict of bytes that they "
     "pickle back to byte for byte, else None. Never runs the pickle."},
    {"md5_hexdigest", md5_hexdigest, METH_O, "md5_hexdigest(data) -> its MD5 as 32 hex digits (bytes)."},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "packfs.swiftmeta._swiftform", NULL, -1, methods};

PyMODINIT_FUNC PyInit__swiftform(void) {
    for (int i = 0; i < 64; i++)
        md5_k[i] = (uint32_t)(fabs(sin(i + 1.0)) * 4294967296.0);
    return PyModule_Create(&module);
}
