/*
 * LOOKUP, GETATTR, whole listings, a file's first GETXATTR and READs of whole records in
 * the page cache answered in C from the inode table itself (option metacache; see
 * fuseshim.py for why, _tablelayout.h and tablelayout.py for what is read).
 *
 * pyfuse3 calls libfuse's handlers from fuse_session_process_buf on the event loop's
 * thread with the GIL held, so these read the table's Python objects directly, with the
 * C API and no Python code: the columns as buffers taken anew for each request (a column
 * the table grew, widened or replaced is the one read), the dicts with PyDict_GetItem.
 * Python stays the only writer of the table, but for the kernel's references: a LOOKUP
 * answered here adds one to the child's `lookups`, as Operations.entry does, so that
 * FORGET's accounting holds. Whatever these cannot answer exactly as Operations would
 * (an inode that is gone, a device, a file with unflushed data beside its records or a
 * long extent map, a reference count at its column's top, a name too long, "." and "..")
 * goes to pyfuse3's handler, as does every GETATTR while files may be staged (passthrough).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define FUSE_USE_VERSION 31
#include <fuse_lowlevel.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <linux/fuse.h>
#include <sys/uio.h>
#include <zlib.h>
#include "_shimmeta.h"
#include "_tablelayout.h"

static PyObject *table;             /* the InodeTable, while packfs_shim_meta_serve gave one */
static double entry_timeout, attr_timeout;
static int getattr_in_c;            /* 0 while files may be staged: Operations.getattr absorbs them */
static unsigned long long answered[META_OPS];

typedef struct {
    Py_buffer v;
    int held;
} column_t;

/* obj.name (a new reference), or NULL with no error set. */
static PyObject *attr(PyObject *obj, const char *name)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v == NULL)
        PyErr_Clear();
    return v;
}

static int take(PyObject *obj, const char *name, column_t *c, int writable)
{
    PyObject *o = attr(obj, name);
    if (o == NULL)
        return 0;
    int r = PyObject_GetBuffer(o, &c->v, PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0));
    Py_DECREF(o);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    c->held = 1;
    return 1;
}

static void give_back(column_t *c)
{
    if (c->held)
        PyBuffer_Release(&c->v);
    c->held = 0;
}

static int signed_format(const column_t *c)
{
    return c->v.format != NULL && c->v.format[0] >= 'a' && c->v.format[0] <= 'z';
}

/* The column's value at i; 0 if i is past its end or its items are not 1, 2, 4 or 8 bytes. */
static int value_at(const column_t *c, uint64_t i, int64_t *out)
{
    Py_ssize_t size = c->v.itemsize;
    if (size <= 0 || i >= (uint64_t)(c->v.len / size))
        return 0;
    const char *p = (const char *)c->v.buf + i * size;
    int s = signed_format(c);
    switch (size) {
    /* (each side widened first: `s ? int32 : uint32` would be unsigned, and a negative value wrong) */
    case 1: *out = s ? (int64_t) * (const int8_t *)p : (int64_t) * (const uint8_t *)p; return 1;
    case 2: *out = s ? (int64_t) * (const int16_t *)p : (int64_t) * (const uint16_t *)p; return 1;
    case 4: *out = s ? (int64_t) * (const int32_t *)p : (int64_t) * (const uint32_t *)p; return 1;
    case 8: *out = *(const int64_t *)p; return 1; /* (q: no u64 column holds a value past 2^63) */
    }
    return 0;
}

static int64_t as_int(PyObject *v, int *ok)
{
    int64_t n = PyLong_AsLongLong(v);
    if (n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return n;
}

/* obj.<dict>.get(key): 1 and its value (borrowed) if there, 0 if not, -1 if it cannot be
 * told. key: a new reference, or NULL (then -1); taken over. */
static int item_of(PyObject *obj, const char *dict_name, PyObject *key, PyObject **value)
{
    PyObject *d = attr(obj, dict_name);
    if (d == NULL || !PyDict_Check(d) || key == NULL) {
        Py_XDECREF(d);
        Py_XDECREF(key);
        PyErr_Clear();
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(d, key);
    Py_DECREF(key);
    Py_DECREF(d); /* (obj holds the dict, and the dict its value: no Python code runs meanwhile) */
    if (v == NULL) {
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        return 0;
    }
    *value = v;
    return 1;
}

/* table.<dict>.get(ino), as item_of. */
static int entry_of(const char *dict_name, uint64_t ino, PyObject **value)
{
    return item_of(table, dict_name, PyLong_FromUnsignedLongLong(ino), value);
}

/* An int-valued dict's value for ino, or `absent` if it has none; 0 if it cannot be told. */
static int int_entry(const char *dict_name, uint64_t ino, int64_t absent, int64_t *out)
{
    PyObject *v;
    int r = entry_of(dict_name, ino, &v);
    if (r < 0)
        return 0;
    if (r == 0) {
        *out = absent;
        return 1;
    }
    int ok = PyLong_Check(v);
    *out = ok ? as_int(v, &ok) : 0;
    return ok;
}

/* (mode, uid, gid, nlink) of kind k (table.kinds[k]). */
static int kind_of(int64_t k, int64_t out[4])
{
    PyObject *kinds = attr(table, TL_KINDS_ATTR);
    int ok = kinds != NULL && PyList_Check(kinds) && k > 0 && k < PyList_GET_SIZE(kinds);
    if (ok) {
        PyObject *t = PyList_GET_ITEM(kinds, k);
        ok = PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 4;
        for (int i = 0; ok && i < 4; i++)
            out[i] = as_int(PyTuple_GET_ITEM(t, i), &ok);
    }
    Py_XDECREF(kinds);
    return ok;
}

/* One of the table's OffsetTimes (atime, ctime): the slot's time given its mtime, as offsettimes.py keeps it. */
static int time_of(const char *which, uint64_t ino, int64_t mtime, int sign, int64_t *out)
{
    PyObject *times = attr(table, which);
    if (times == NULL)
        return 0;
    column_t col = {0}, far = {0};
    int64_t v, whole;
    int ok = take(times, TL_TIMES_COLUMN_ATTR, &col, 0) && value_at(&col, ino, &v);
    if (ok && col.v.itemsize == 8)
        *out = v;
    else if (ok && v < (int64_t)TL_FAR)
        *out = mtime + sign * v;
    else if (ok && (ok = take(times, TL_TIMES_FAR_ATTR, &far, 0) && value_at(&far, v - TL_FAR, &whole)))
        *out = whole;
    give_back(&col);
    give_back(&far);
    Py_DECREF(times);
    return ok;
}

/* The bytes of a file's unflushed run (its `wbuf`'s size; 0: none), or -1 if C cannot tell. */
static int64_t unflushed(uint64_t ino)
{
    PyObject *run;
    int has = entry_of(TL_WBUF_ATTR, ino, &run);
    if (has <= 0)
        return has;
    PyObject *size = attr(run, TL_RUN_SIZE_ATTR);
    int ok = size != NULL && PyLong_Check(size);
    int64_t n = ok ? as_int(size, &ok) : -1;
    Py_XDECREF(size);
    return ok ? n : -1;
}

/* The bytes of a regular file's data its records or its unflushed run hold
 * (WriteBehind.data_bytes), if its map is one whole record (`rec`), none, or packed; with
 * an unflushed run, only if it has no map (the run lies over nothing). */
static int file_bytes(uint64_t ino, int64_t size, int64_t *out)
{
    PyObject *v;
    column_t rec = {0};
    int64_t r, run = unflushed(ino);
    int ok = run >= 0 && take(table, TL_KNAME_ATTR, &rec, 0) && value_at(&rec, ino, &r);
    give_back(&rec);
    if (!ok || (run && r))
        return 0;
    if (r) {
        *out = size; /* one whole record, as long as the file */
        return 1;
    }
    int has = entry_of(TL_EXTENTS_ATTR, ino, &v);
    if (has == 0) {
        *out = run;
        return 1;
    }
    if (run)
        return 0;
    if (has < 0 || !PyBytes_Check(v) || PyBytes_GET_SIZE(v) % TL_EXTENT_SIZE)
        return 0;
    const char *p = PyBytes_AS_STRING(v);
    int64_t sum = 0;
    for (Py_ssize_t at = 0; at < PyBytes_GET_SIZE(v); at += TL_EXTENT_SIZE) {
        uint32_t n;
        memcpy(&n, p + at + TL_EXTENT_LEN_AT, sizeof n);
        sum += n;
    }
    *out = sum;
    return 1;
}

int packfs_shim_meta_attr(uint64_t ino, struct stat *st)
{
    if (table == NULL)
        return 0;
    column_t col = {0};
    int64_t k, kind[4], size, rdev, mtime, atime, ctime, held;
    int ok = take(table, TL_KIND_ATTR, &col, 0) && value_at(&col, ino, &k) && k != 0;
    give_back(&col);
    if (!ok || !kind_of(k, kind))
        return 0;
    int64_t mode = kind[0], nlink = kind[3], type = mode & S_IFMT;
    if (type == S_IFCHR || type == S_IFBLK)
        return 0; /* (rdev is read below all the same: a device's is what it is for) */
    if (nlink == (int64_t)TL_NLINK_TOP && !int_entry(TL_WIDE_NLINK_ATTR, ino, -1, &nlink))
        return 0;
    ok = take(table, TL_SIZE_ATTR, &col, 0) && value_at(&col, ino, &size);
    give_back(&col);
    if (!ok || nlink < 0)
        return 0;
    if (type == S_IFDIR)
        size = 0; /* the column holds its parent */
    else if (size == (int64_t)TL_SIZE_TOP && !int_entry(TL_WIDE_SIZE_ATTR, ino, -1, &size))
        return 0;
    if (size < 0 || !int_entry(TL_RDEV_ATTR, ino, 0, &rdev))
        return 0;
    ok = take(table, TL_MTIME_ATTR, &col, 0) && value_at(&col, ino, &mtime);
    give_back(&col);
    if (!ok || !time_of(TL_ATIMES_ATTR, ino, mtime, -1, &atime) || !time_of(TL_CTIMES_ATTR, ino, mtime, 1, &ctime))
        return 0;
    if (type == S_IFREG) {
        if (!file_bytes(ino, size, &held))
            return 0;
    } else {
        held = size;
    }
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_mode = mode;
    st->st_nlink = nlink;
    st->st_uid = kind[1];
    st->st_gid = kind[2];
    st->st_rdev = rdev;
    st->st_size = size;
    st->st_blksize = TL_BLKSIZE;
    st->st_blocks = (held + 511) / 512;
    /* floor division, as pyfuse3's setters (a time before 1970 too) */
    int64_t ns[3] = {atime, mtime, ctime};
    struct timespec *ts[3] = {&st->st_atim, &st->st_mtim, &st->st_ctim};
    for (int i = 0; i < 3; i++) {
        int64_t s = ns[i] / 1000000000, rem = ns[i] % 1000000000;
        if (rem < 0) {
            s -= 1;
            rem += 1000000000;
        }
        ts[i]->tv_sec = s;
        ts[i]->tv_nsec = rem;
    }
    return 1;
}

/* Directory entries (dirents.py's forms) ------------------------------------------------ */

/* The name a `stored_name` string keeps (dirents.name_of), NUL-terminated in out[256]. */
static int name_of(const unsigned char *s, size_t n, char *out)
{
    static const char *hex = "0123456789abcdef";
    static const char *exts[] = TL_STAMP_EXTS;
    if (n >= 1 && s[0] == TL_HEX_MARK) {
        if (2 * (n - 1) > 255)
            return 0;
        for (size_t i = 1; i < n; i++) {
            out[2 * i - 2] = hex[s[i] >> 4];
            out[2 * i - 1] = hex[s[i] & 15];
        }
        out[2 * (n - 1)] = 0;
        return 1;
    }
    if (n == 2 + TL_STAMP_BYTES && s[0] == TL_STAMP_MARK && s[n - 1] < TL_STAMP_EXT_COUNT) {
        uint64_t stamp = 0;
        char digits[24];
        for (size_t i = 1; i <= TL_STAMP_BYTES; i++)
            stamp = stamp << 8 | s[i];
        snprintf(digits, sizeof digits, "%015llu", (unsigned long long)stamp);
        return snprintf(out, 256, "%.10s.%s%s", digits, digits + 10, exts[s[n - 1]]) < 256;
    }
    if (n > 255 || memchr(s, 0, n))
        return 0;
    memcpy(out, s, n);
    out[n] = 0;
    return 1;
}

static int stored_equals(const unsigned char *s, size_t n, const char *name, size_t len)
{
    char made[256];
    return name_of(s, n, made) && strlen(made) == len && memcmp(made, name, len) == 0;
}

/* Where SEP name SEP is in buf[from:n], or -1. */
static Py_ssize_t find_entry(const unsigned char *buf, Py_ssize_t n, Py_ssize_t from, const char *name, size_t len)
{
    for (Py_ssize_t i = from; i + (Py_ssize_t)len + 2 <= n; i++) {
        const unsigned char *hit = memchr(buf + i, TL_SEP, n - i);
        if (hit == NULL)
            return -1;
        i = hit - buf;
        if (i + (Py_ssize_t)len + 2 <= n && memcmp(buf + i + 1, name, len) == 0 && buf[i + 1 + len] == TL_SEP)
            return i;
    }
    return -1;
}

static Py_ssize_t separators(const unsigned char *buf, Py_ssize_t from, Py_ssize_t to)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = from; i < to; i++)
        count += buf[i] == TL_SEP;
    return count;
}

/* A directory kept in `dirs`: a dict, or dirents.PackedEntries. */
static int big_child(PyObject *big, const char *name, size_t len, uint64_t *child)
{
    if (PyDict_Check(big)) {
        PyObject *key = PyBytes_FromStringAndSize(name, len);
        PyObject *v = key ? PyDict_GetItemWithError(big, key) : NULL;
        Py_XDECREF(key);
        if (v == NULL)
            return PyErr_Occurred() ? (PyErr_Clear(), -1) : 0;
        int ok = PyLong_Check(v);
        *child = ok ? (uint64_t)as_int(v, &ok) : 0;
        return ok ? 1 : -1;
    }
    column_t names = {0}, inos = {0};
    PyObject *w = attr(big, TL_PACKED_WIDTH_ATTR);
    int ok = 1;
    int64_t width = w != NULL && PyLong_Check(w) ? as_int(w, &ok) : -1, ino;
    Py_XDECREF(w);
    int r = -1;
    if (ok && width >= 0 && take(big, TL_PACKED_NAMES_ATTR, &names, 0) && take(big, TL_PACKED_INOS_ATTR, &inos, 0)) {
        const unsigned char *buf = names.v.buf;
        Py_ssize_t pos = find_entry(buf, names.v.len, 0, name, len);
        if (pos < 0) {
            r = 0;
        } else if (value_at(&inos, width ? pos / width : separators(buf, 0, pos), &ino)) {
            *child = ino;
            r = 1;
        }
    }
    give_back(&names);
    give_back(&inos);
    return r;
}

/* The names arena's string `ref` (arena.CountedArena): its bytes in `arena`'s buffer. */
static int arena_string(column_t *arena, int64_t grain, int64_t ref, const unsigned char **s, size_t *n)
{
    const unsigned char *data = arena->v.buf;
    Py_ssize_t at = (ref - 1) * grain, size = arena->v.len;
    uint64_t len = 0;
    for (int shift = 0; at < size && shift < 35; shift += 7) {
        unsigned char b = data[at++];
        len |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            if (ref < 1 || (uint64_t)(size - at) < len)
                return 0;
            *s = data + at;
            *n = len;
            return 1;
        }
    }
    return 0;
}

/* The string a directory keeps in its own slot (`kname`, a reference into the names
 * arena): its bytes, valid while `arena` is held. */
static int slot_string(uint64_t d, column_t *arena, const unsigned char **s, size_t *n)
{
    column_t kname = {0};
    PyObject *names = attr(table, TL_NAMES_ATTR), *g = names ? attr(names, TL_ARENA_GRAIN_ATTR) : NULL;
    int ok = g != NULL && PyLong_Check(g);
    int64_t grain = ok ? as_int(g, &ok) : 0, ref;
    ok = ok && take(table, TL_KNAME_ATTR, &kname, 0) && value_at(&kname, d, &ref) &&
         take(names, TL_ARENA_DATA_ATTR, arena, 0) && arena_string(arena, grain, ref, s, n);
    give_back(&kname);
    Py_XDECREF(g);
    Py_XDECREF(names);
    return ok;
}

/* Whether a dirents.pack_small string is whole: its count, its inode numbers, its names. */
static int small_whole(const unsigned char *s, size_t n)
{
    return n >= 2 && n >= 2 + 4 * (size_t)s[0] && s[1 + 4 * s[0]] == TL_SEP && s[n - 1] == TL_SEP;
}

/* The entries kept in the directory's own slot: one name, or a few (dirents.pack_small). */
static int slot_child(uint64_t d, int64_t kid, const char *name, size_t len, uint64_t *child)
{
    column_t arena = {0};
    const unsigned char *s;
    size_t n;
    int r = -1;
    if (slot_string(d, &arena, &s, &n)) {
        if (kid != (int64_t)TL_SMALL) {
            r = stored_equals(s, n, name, len);
            *child = kid;
        } else if (small_whole(s, n)) {
            Py_ssize_t start = 1 + 4 * s[0], pos = find_entry(s, n, start, name, len);
            r = 0;
            if (pos >= 0) {
                Py_ssize_t i = separators(s, start, pos);
                uint32_t ino;
                memcpy(&ino, s + 1 + 4 * i, sizeof ino); /* little-endian, as dirents._INO */
                *child = ino;
                r = 1;
            }
        }
    }
    give_back(&arena);
    return r;
}

/* The directory's child `name`: 1 and its inode, 0 if it has none, -1 if C cannot tell
 * (InodeTable.child). */
static int child_of(uint64_t d, const char *name, size_t len, uint64_t *child)
{
    PyObject *big;
    int r = entry_of(TL_DIRS_ATTR, d, &big);
    if (r < 0)
        return -1;
    if (r > 0)
        return big_child(big, name, len, child);
    column_t kid = {0};
    int64_t k;
    int ok = take(table, TL_KID_ATTR, &kid, 0) && value_at(&kid, d, &k);
    give_back(&kid);
    if (!ok)
        return -1;
    return k == 0 ? 0 : slot_child(d, k, name, len, child);
}

/* The kernel takes a reference to `ino` (Operations.entry): its lookup count + 1, unless
 * that needs a wider column (Python widens it). */
static int add_reference(uint64_t ino)
{
    column_t col = {0};
    int64_t v;
    int ok = take(table, TL_LOOKUPS_ATTR, &col, 1) && value_at(&col, ino, &v) && !signed_format(&col) &&
             col.v.itemsize <= 4 && (uint64_t)v < (1ULL << (8 * col.v.itemsize)) - 1;
    if (ok) {
        char *p = (char *)col.v.buf + ino * col.v.itemsize;
        switch (col.v.itemsize) {
        case 1: *(uint8_t *)p = v + 1; break;
        case 2: *(uint16_t *)p = v + 1; break;
        default: *(uint32_t *)p = v + 1;
        }
    }
    give_back(&col);
    return ok;
}

int packfs_shim_meta_entry(uint64_t parent, const char *name, size_t len, struct fuse_entry_param *e)
{
    if (table == NULL || len == 0 || len > 255 || (name[0] == '.' && (len == 1 || (len == 2 && name[1] == '.'))))
        return 0;
    column_t col = {0};
    int64_t k, kind[4];
    int ok = take(table, TL_KIND_ATTR, &col, 0) && value_at(&col, parent, &k) && k != 0;
    give_back(&col);
    if (!ok || !kind_of(k, kind) || (kind[0] & S_IFMT) != S_IFDIR)
        return 0;
    uint64_t child = 0;
    int r = child_of(parent, name, len, &child);
    if (r < 0)
        return 0;
    memset(e, 0, sizeof *e);
    if (r == 0) { /* a negative entry, cached for entry_timeout (Operations.lookup) */
        e->entry_timeout = entry_timeout;
        e->attr_timeout = TL_ENTRY_DEFAULT_ATTR_TIMEOUT;
        e->attr.st_mode = TL_ENTRY_DEFAULT_MODE;
        e->attr.st_blksize = TL_ENTRY_DEFAULT_BLKSIZE;
        e->attr.st_nlink = TL_ENTRY_DEFAULT_NLINK;
        return 2;
    }
    if (!packfs_shim_meta_attr(child, &e->attr) || !add_reference(child))
        return 0;
    e->ino = child;
    e->entry_timeout = entry_timeout;
    e->attr_timeout = attr_timeout;
    return 1;
}

/* Whole listings (READDIRPLUS from offset 0) ------------------------------------------- */

static int atime_rule; /* what a listing does to its directory's atime (Filesystem.accessed) */

typedef int (*child_fn)(void *ctx, const char *name, uint64_t ino); /* 0: go on; else stop with it */

/* Calls fn for each of "/a/b/c/"'s names from `from`, with inos[i] (a buffer) or the
 * `count` little-endian u32s at `les`. */
static int each_packed(const unsigned char *buf, Py_ssize_t n, Py_ssize_t from, const column_t *inos,
                       const unsigned char *les, uint64_t count, child_fn fn, void *ctx)
{
    char name[256];
    uint64_t i = 0;
    for (Py_ssize_t at = from + 1; at < n; i++) {
        const unsigned char *end = memchr(buf + at, TL_SEP, n - at);
        int64_t ino;
        uint32_t le;
        if (end == NULL || end - (buf + at) > 255)
            return -1;
        size_t len = end - (buf + at);
        memcpy(name, buf + at, len);
        name[len] = 0;
        if (inos != NULL) {
            if (!value_at(inos, i, &ino))
                return -1;
        } else {
            if (i >= count)
                return -1;
            memcpy(&le, les + 4 * i, sizeof le);
            ino = le;
        }
        int r = fn(ctx, name, ino);
        if (r)
            return r;
        at += len + 1;
    }
    return 0;
}

/* Calls fn for each entry of directory d, in the order InodeTable.children gives them;
 * -1 if C cannot tell them, else what the last fn returned (0: all of them). */
static int each_child(uint64_t d, child_fn fn, void *ctx)
{
    PyObject *big;
    int r = entry_of(TL_DIRS_ATTR, d, &big);
    if (r < 0)
        return -1;
    if (r > 0 && PyDict_Check(big)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(big, &pos, &k, &v)) {
            int ok = PyBytes_Check(k) && PyLong_Check(v) && PyBytes_GET_SIZE(k) <= 255 &&
                     strlen(PyBytes_AS_STRING(k)) == (size_t)PyBytes_GET_SIZE(k);
            int64_t ino = ok ? as_int(v, &ok) : 0;
            if (!ok)
                return -1;
            if ((r = fn(ctx, PyBytes_AS_STRING(k), ino)))
                return r;
        }
        return 0;
    }
    if (r > 0) {
        column_t names = {0}, inos = {0};
        r = -1;
        if (take(big, TL_PACKED_NAMES_ATTR, &names, 0) && take(big, TL_PACKED_INOS_ATTR, &inos, 0))
            r = inos.v.len == 0 ? 0 : each_packed(names.v.buf, names.v.len, 0, &inos, NULL, 0, fn, ctx);
        give_back(&names);
        give_back(&inos);
        return r;
    }
    column_t kid = {0}, arena = {0};
    int64_t k;
    int ok = take(table, TL_KID_ATTR, &kid, 0) && value_at(&kid, d, &k);
    give_back(&kid);
    if (!ok)
        return -1;
    if (k == 0)
        return 0;
    const unsigned char *s;
    size_t n;
    char name[256];
    r = -1;
    if (slot_string(d, &arena, &s, &n)) {
        if (k != (int64_t)TL_SMALL)
            r = name_of(s, n, name) ? fn(ctx, name, k) : -1;
        else if (small_whole(s, n))
            r = each_packed(s, n, 1 + 4 * s[0], NULL, s + 1, s[0], fn, ctx);
    }
    give_back(&arena);
    return r;
}

struct listing {
    fuse_req_t req;
    char *buf;
    size_t size, used;
    uint64_t *inos;
    size_t count, room;
};

/* One entry into the reply (Operations.readdir: its attributes, the offset to resume
 * after it); 1 if it does not fit or C cannot answer it. */
static int add_entry(void *ctx, const char *name, uint64_t ino)
{
    struct listing *l = ctx;
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    if (l->count == l->room || !packfs_shim_meta_attr(ino, &e.attr))
        return 1;
    e.ino = ino;
    e.entry_timeout = entry_timeout;
    e.attr_timeout = attr_timeout;
    l->inos[l->count++] = ino;
    /* a listing C answered whole is snapshot 0, which Listings never numbers: a reader
     * that comes back within it resumes at the same index of a fresh listing */
    size_t n = fuse_add_direntry_plus(l->req, l->buf + l->used, l->size - l->used, name, &e, l->count);
    if (n > l->size - l->used)
        return 1;
    l->used += n;
    return 0;
}

/* Whether a listing of d leaves its atime as it is (Filesystem.accessed): else Python lists it. */
static int atime_stays(uint64_t d)
{
    if (atime_rule == TL_ATIME_NEVER)
        return 1;
    if (atime_rule != TL_ATIME_RELATIVE)
        return 0;
    column_t col = {0};
    int64_t mtime, atime, ctime;
    int ok = take(table, TL_MTIME_ATTR, &col, 0) && value_at(&col, d, &mtime);
    give_back(&col);
    if (!ok || !time_of(TL_ATIMES_ATTR, d, mtime, -1, &atime) || !time_of(TL_CTIMES_ATTR, d, mtime, 1, &ctime))
        return 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    return atime > mtime && atime > ctime && ns - atime < (int64_t)TL_RELATIME_NS;
}

/* Every entry of a listing of `d` from offset 0 answered at once in a reply of at most
 * `size` bytes, as Operations.readdir would: the reply's length if so (the caller notes
 * the listing's end at `*end` unless it is 0: an empty directory), -1 if it is Python's (it does not fit, an entry C cannot answer, an atime to
 * set). Each entry given takes the kernel's reference. */
ssize_t packfs_shim_meta_listing(fuse_req_t req, uint64_t d, size_t size, char *buf, off_t *end)
{
    if (table == NULL)
        return -1;
    column_t col = {0};
    int64_t k, kind[4];
    int ok = take(table, TL_KIND_ATTR, &col, 0) && value_at(&col, d, &k) && k != 0;
    give_back(&col);
    if (!ok || !kind_of(k, kind) || (kind[0] & S_IFMT) != S_IFDIR || !atime_stays(d))
        return -1;
    uint64_t inos[size / sizeof(struct fuse_direntplus) + 1];
    struct listing l = {req, buf, size, 0, inos, 0, sizeof inos / sizeof inos[0]};
    if (each_child(d, add_entry, &l) != 0)
        return -1;
    column_t refs = {0};
    ok = take(table, TL_LOOKUPS_ATTR, &refs, 0) && !signed_format(&refs) && refs.v.itemsize <= 4;
    for (size_t i = 0; ok && i < l.count; i++) { /* (a name twice in a listing: hard links) */
        int64_t v;
        ok = value_at(&refs, inos[i], &v) && (uint64_t)v + l.count < (1ULL << (8 * refs.v.itemsize)) - 1;
    }
    give_back(&refs);
    if (!ok)
        return -1;
    for (size_t i = 0; i < l.count; i++)
        add_reference(inos[i]);
    *end = l.count;
    answered[META_LISTING]++;
    return l.used;
}

/* Reads of whole records in the page cache (READ) ---------------------------------------- */

static PyObject *store;             /* the Volumes, handed over with the table */
static unsigned char *record_buf;   /* the last record read: a READ's reply points into it */
static size_t record_room;

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* A regular file's one whole record (the `rec` column): its volume's number, its offset
 * in the volume and its payload's length, the file's size; 0 if the file has none, an
 * unflushed run, or a size C does not read. */
static int whole_record(uint64_t ino, int64_t *volume, uint64_t *at, int64_t *length)
{
    column_t col = {0};
    int64_t k, kind[4], rec, index;
    int ok = take(table, TL_KIND_ATTR, &col, 0) && value_at(&col, ino, &k) && k != 0;
    give_back(&col);
    if (!ok || !kind_of(k, kind) || (kind[0] & S_IFMT) != S_IFREG)
        return 0;
    ok = take(table, TL_SIZE_ATTR, &col, 0) && value_at(&col, ino, length) && *length != (int64_t)TL_SIZE_TOP;
    give_back(&col);
    ok = ok && take(table, TL_KNAME_ATTR, &col, 0) && value_at(&col, ino, &rec) && rec > 0;
    give_back(&col);
    if (!ok || unflushed(ino) != 0)
        return 0;
    index = rec >> TL_REC_PAGE_BITS;
    *at = (uint64_t)(rec & ((1LL << TL_REC_PAGE_BITS) - 1)) << TL_REC_PAGE_SHIFT;
    ok = take(table, TL_VOLUMES_ATTR, &col, 0) && value_at(&col, index, volume) && index > 0;
    give_back(&col);
    return ok;
}

/* The open file of the volume holding the record at `at`, if the record is written (not
 * queued in the log); -1 if not, or if its volume is not open. */
static int written_record_fd(int64_t volume, uint64_t at)
{
    PyObject *v;
    int queued = item_of(store, TL_STORE_INFLIGHT_ATTR, Py_BuildValue("(LK)", (long long)volume,
                                                                        (unsigned long long)at), &v);
    if (queued != 0 || item_of(store, TL_STORE_FDS_ATTR, PyLong_FromLongLong(volume), &v) != 1 || !PyLong_Check(v))
        return -1;
    int ok = 1;
    int64_t fd = as_int(v, &ok);
    return ok && fd >= 0 && fd <= INT32_MAX ? (int)fd : -1;
}

/* The record at `at` of volume `volume`, if it is written and in the page cache: its n
 * bytes read with RWF_NOWAIT into record_buf, as Volumes.read reads a warm record. */
static int cached_record(int64_t volume, uint64_t at, size_t n)
{
    int fd = written_record_fd(volume, at);
    if (fd < 0)
        return 0;
    if (n > record_room) {
        unsigned char *b = realloc(record_buf, n);
        if (b == NULL)
            return 0;
        record_buf = b;
        record_room = n;
    }
    struct iovec iov = {record_buf, n};
    return preadv2(fd, &iov, 1, (off_t)at, RWF_NOWAIT) == (ssize_t)n;
}

/* Whether record_buf starts with the intact header of a DATA record of ino with `length`
 * bytes of payload, checked as records.decode_header checks one. */
static int header_intact(uint64_t ino, int64_t length)
{
    static const char magic[] = TL_RECORD_MAGIC;
    const unsigned char *h = record_buf;
    PyObject *p = attr(store, TL_STORE_PACK_ID_ATTR);
    int ok = p != NULL && PyLong_Check(p);
    int64_t pack_id = ok ? as_int(p, &ok) : -1;
    Py_XDECREF(p);
    return ok && memcmp(h, magic, sizeof magic - 1) == 0 &&
           le32(h + TL_RECORD_HEADER_CRC_AT) == crc32(0, h, TL_RECORD_HEADER_CRC_AT) &&
           le32(h + TL_RECORD_PACK_ID_AT) == (uint32_t)pack_id && h[TL_RECORD_TYPE_AT] == TL_RECORD_DATA &&
           le64(h + TL_RECORD_INO_AT) == ino && le32(h + TL_RECORD_LENGTH_AT) == (uint64_t)length;
}

/* Whether record_buf holds an intact DATA record of ino with `length` bytes of payload,
 * checked as Volumes._verified checks one (records.py's header and both CRC-32s). */
static int intact(uint64_t ino, int64_t length)
{
    return header_intact(ino, length) &&
           le32(record_buf + TL_RECORD_PAYLOAD_CRC_AT) == crc32(0, record_buf + TL_RECORD_HEADER_SIZE, (uInt)length);
}

/* A READ of `size` bytes at `off` of a file whose data is one whole record already in the
 * page cache, as Operations.read would answer it: the bytes (valid until the next call),
 * their count in *n; NULL if it is Python's: a record not in the page cache, queued, too
 * large to read whole on the loop, or not intact (Python reads it again and says EIO and
 * why), a file that is staged, has unflushed data or other extents, or whose atime the
 * read would set (noatime: the file was opened O_NOATIME). */
static const unsigned char *record_read(uint64_t ino, size_t size, off_t off, int noatime, size_t *n)
{
    int64_t volume, length;
    uint64_t at;
    if (table == NULL || store == NULL || !getattr_in_c || off < 0 || !whole_record(ino, &volume, &at, &length) ||
        (!noatime && !atime_stays(ino)))
        return NULL;
    if (off >= length) {
        *n = 0;
        return (const unsigned char *)"";
    }
    if (length > (int64_t)TL_READ_MAX || !cached_record(volume, at, TL_RECORD_HEADER_SIZE + length) ||
        !intact(ino, length))
        return NULL;
    *n = (size_t)(length - off) < size ? (size_t)(length - off) : size;
    return record_buf + TL_RECORD_HEADER_SIZE + off;
}

int packfs_shim_meta_read(fuse_req_t req, uint64_t ino, size_t size, off_t off, int noatime)
{
    size_t n;
    const unsigned char *p = record_read(ino, size, off, noatime, &n);
    if (p == NULL)
        return 0;
    answered[META_READ]++;
    fuse_reply_buf(req, (const char *)p, n);
    return 1;
}

ssize_t packfs_shim_meta_read_flat(uint64_t ino, size_t size, int64_t off, int noatime, char *out)
{
    size_t n;
    const unsigned char *p = record_read(ino, size, off, noatime, &n);
    if (p == NULL)
        return -1;
    memcpy(out, p, n);
    return n;
}

/* Xattrs and the read-ahead of a file's first GETXATTR -------------------------------------- */

static PyObject *swift_decoder, *swift_zdict; /* xattrblob.swift_form_decoder(): C, if built */
static int prefetching;                       /* Options.prefetch */
static unsigned long long prefetched;

/* A packed xattr blob as xattrblob.plain gives it: a new reference to bytes; NULL if C
 * leaves it to Python (a form only Python decodes; one that does not decode, which Python
 * reports as EIO). */
static PyObject *plain_blob(const unsigned char *s, size_t n)
{
    static const char prefixes[] = TL_XATTR_PREFIXES, swift[] = TL_XATTR_SWIFT_PREFIX;
    int compressed = 0;
    for (size_t i = 0; n >= 2 && i + 2 < sizeof prefixes; i += 2)
        compressed |= memcmp(s, prefixes + i, 2) == 0;
    if (!compressed)
        return PyBytes_FromStringAndSize((const char *)s, n);
    if (memcmp(s, swift, 2) != 0 || swift_decoder == NULL)
        return NULL;
    PyObject *form = PyMemoryView_FromMemory((char *)s + 2, n - 2, PyBUF_READ);
    PyObject *out = form ? PyObject_CallFunctionObjArgs(swift_decoder, form, swift_zdict, NULL) : NULL;
    Py_XDECREF(form);
    if (out != NULL && !PyBytes_Check(out))
        Py_CLEAR(out);
    if (out == NULL)
        PyErr_Clear();
    return out;
}

/* The xattrs file ino's one whole record carries in its padding (IN_RECORD), packed
 * plain, if the record is in the page cache, as Volumes.read_trailer reads them (the
 * header's and the trailer's CRC-32s checked): a new reference to bytes; NULL if C leaves
 * them to Python, which reads the record in a worker thread, and says EIO if it is not
 * intact. */
static PyObject *record_xattrs(uint64_t ino)
{
    int64_t volume, length;
    uint64_t at;
    if (store == NULL || !whole_record(ino, &volume, &at, &length) || length > (int64_t)TL_READ_MAX)
        return NULL;
    size_t blocks = ((size_t)TL_RECORD_HEADER_SIZE + (size_t)length + TL_RECORD_BLOCK - 1) / TL_RECORD_BLOCK;
    size_t n = blocks * TL_RECORD_BLOCK;
    if (!cached_record(volume, at, n) || !header_intact(ino, length) ||
        !(record_buf[TL_RECORD_FLAGS_AT] & TL_RECORD_XATTRS))
        return NULL;
    size_t start = TL_RECORD_HEADER_SIZE + (size_t)length;
    size_t len = (size_t)record_buf[TL_RECORD_RESERVED_AT] | (size_t)record_buf[TL_RECORD_RESERVED_AT + 1] << 8;
    if (start + len + 4 > n || le32(record_buf + start + len) != crc32(0, record_buf + start, (uInt)len))
        return NULL;
    return plain_blob(record_buf + start, len);
}

/* ino's xattrs, packed plain, as InodeTable.plain_xattrs gives them: a new reference to
 * bytes (b"": none); NULL if C leaves them to Python: values only the catalog holds
 * (xattrs_in_memory off), or a record not in the page cache, a compaction of the arena
 * under way, a form C does not decode. */
static PyObject *table_xattrs(uint64_t ino)
{
    if (table == NULL)
        return NULL;
    column_t col = {0}, arena = {0};
    int64_t k, kind[4], ref, grain;
    int ok = take(table, TL_KIND_ATTR, &col, 0) && value_at(&col, ino, &k) && k != 0;
    give_back(&col);
    if (!ok || !kind_of(k, kind))
        return NULL;
    if ((kind[0] & S_IFMT) == S_IFDIR) {
        ok = int_entry(TL_DIR_XAT_ATTR, ino, 0, &ref);
    } else {
        ok = take(table, TL_KID_ATTR, &col, 0) && value_at(&col, ino, &ref);
        give_back(&col);
    }
    PyObject *xnew = attr(table, TL_XATTR_COMPACTING_ATTR);
    ok = ok && xnew == Py_None;
    Py_XDECREF(xnew);
    if (ok && ref == (int64_t)TL_IN_RECORD)
        return record_xattrs(ino);
    if (!ok || ref == (int64_t)TL_IN_CATALOG)
        return NULL;
    if (ref == 0) { /* none, unless set plain and not compressed yet */
        PyObject *v;
        int r = entry_of(TL_XATTR_PLAIN_ATTR, ino, &v);
        if (r == 0)
            return PyBytes_FromStringAndSize("", 0);
        if (r < 0 || !PyBytes_Check(v))
            return NULL;
        Py_INCREF(v); /* (held while the decoder runs) */
        PyObject *out = plain_blob((const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
        Py_DECREF(v);
        return out;
    }
    PyObject *blobs = attr(table, TL_XATTR_ARENA_ATTR), *g = blobs ? attr(blobs, TL_ARENA_GRAIN_ATTR) : NULL;
    const unsigned char *s;
    size_t n;
    PyObject *out = NULL;
    ok = g != NULL && PyLong_Check(g);
    grain = ok ? as_int(g, &ok) : 0;
    if (ok && take(blobs, TL_ARENA_DATA_ATTR, &arena, 0) && arena_string(&arena, grain, ref, &s, &n))
        out = plain_blob(s, n); /* (the arena's buffer is held, so it cannot move meanwhile) */
    give_back(&arena);
    Py_XDECREF(g);
    Py_XDECREF(blobs);
    return out;
}

/* Start the disk read of a regular file's one whole record, as Filesystem._warm does at
 * the first xattr read of a file: Swift reads the data next. */
static void prefetch(uint64_t ino)
{
    int64_t volume, length;
    uint64_t at;
    int fd;
    if (!prefetching || store == NULL || !whole_record(ino, &volume, &at, &length) || length > (int64_t)TL_READ_MAX ||
        (fd = written_record_fd(volume, at)) < 0)
        return;
    if (posix_fadvise(fd, (off_t)at, TL_RECORD_HEADER_SIZE + length, POSIX_FADV_WILLNEED) == 0)
        prefetched++;
}

int packfs_shim_meta_hand_xattrs(uint64_t ino)
{
    PyObject *blob = table_xattrs(ino);
    if (blob == NULL)
        return 0;
    int ok = PyBytes_GET_SIZE(blob) <= (Py_ssize_t)TL_CACHED_XATTRS_MAX &&
             packfs_shim_cache_xattrs(ino, PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob));
    Py_DECREF(blob);
    if (ok)
        prefetch(ino);
    return ok;
}

ssize_t packfs_shim_meta_xattrs_flat(uint64_t ino, char *out, size_t room)
{
    PyObject *blob = table_xattrs(ino);
    if (blob == NULL)
        return -1;
    ssize_t n = PyBytes_GET_SIZE(blob);
    if ((size_t)n <= room)
        memcpy(out, PyBytes_AS_STRING(blob), n);
    Py_DECREF(blob);
    return n;
}

unsigned long long packfs_shim_meta_prefetched(void)
{
    return prefetched;
}

static void (*next_lookup)(fuse_req_t, fuse_ino_t, const char *);
static void (*next_getattr)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);

static void lookup_in_c(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e;
    int r = packfs_shim_meta_entry(parent, name, strlen(name), &e);
    if (r == 0) {
        next_lookup(req, parent, name);
        return;
    }
    answered[r == 1 ? META_LOOKUP : META_LOOKUP_MISS]++;
    fuse_reply_entry(req, &e);
}

static void getattr_from_table(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat st;
    if (!getattr_in_c || !packfs_shim_meta_attr(ino, &st)) {
        next_getattr(req, ino, fi);
        return;
    }
    answered[META_GETATTR]++;
    fuse_reply_attr(req, &st, attr_timeout);
}

void packfs_shim_meta_install(struct fuse_lowlevel_ops *ops)
{
    if (ops->lookup && ops->getattr) {
        next_lookup = ops->lookup;
        next_getattr = ops->getattr;
        ops->lookup = lookup_in_c;
        ops->getattr = getattr_from_table;
    }
}

int packfs_shim_meta_installed(const struct fuse_lowlevel_ops *ops)
{
    return ops->lookup == lookup_in_c;
}

static void hold(PyObject **held, PyObject *obj)
{
    PyObject *old = *held;
    *held = obj != NULL && obj != Py_None ? obj : NULL;
    Py_XINCREF(*held);
    Py_XDECREF(old);
}

void packfs_shim_meta_serve(PyObject *inode_table, PyObject *volumes, PyObject *decoder, PyObject *zdict,
                            double entry_secs, double attr_secs, int getattr_too, int atime, int read_ahead)
{
    atime_rule = atime;
    prefetching = read_ahead;
    hold(&table, inode_table);
    hold(&store, volumes);
    hold(&swift_decoder, decoder);
    hold(&swift_zdict, zdict);
    entry_timeout = entry_secs;
    attr_timeout = attr_secs;
    getattr_in_c = getattr_too;
}

unsigned long long packfs_shim_meta_answered(int op)
{
    return op >= 0 && op < META_OPS ? answered[op] : 0;
}

/* What C answers, flat, for Python to compare with its own (fuseshim.meta_lookup and
 * meta_getattr): out = ino, mode, nlink, uid, gid, rdev, size, blksize, blocks, atime,
 * mtime, ctime (ns), entry and attr timeouts (ms). Returns what the answer was: 0 none
 * (pyfuse3's handler would serve it), 1 an entry (a LOOKUP takes a reference, as here), 2
 * a negative entry. */
static void flatten(const struct stat *st, int64_t *out)
{
    const struct timespec *ts[3] = {&st->st_atim, &st->st_mtim, &st->st_ctim};
    int64_t v[9] = {st->st_ino, st->st_mode, st->st_nlink, st->st_uid, st->st_gid, st->st_rdev, st->st_size,
                    st->st_blksize, st->st_blocks};
    memcpy(out, v, sizeof v);
    for (int i = 0; i < 3; i++)
        out[9 + i] = (int64_t)ts[i]->tv_sec * 1000000000 + ts[i]->tv_nsec;
}

int packfs_shim_meta_lookup_flat(uint64_t parent, const char *name, size_t len, int64_t out[META_FLAT])
{
    struct fuse_entry_param e;
    int r = packfs_shim_meta_entry(parent, name, len, &e);
    if (r) {
        flatten(&e.attr, out);
        out[0] = e.ino;
        out[12] = (int64_t)(e.entry_timeout * 1000);
        out[13] = (int64_t)(e.attr_timeout * 1000);
    }
    return r;
}

int packfs_shim_meta_getattr_flat(uint64_t ino, int64_t out[META_FLAT])
{
    struct stat st;
    if (!getattr_in_c || !packfs_shim_meta_attr(ino, &st))
        return 0;
    flatten(&st, out);
    out[12] = 0;
    out[13] = (int64_t)(attr_timeout * 1000);
    return 1;
}
