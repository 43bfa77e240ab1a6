/*
 * What packfs needs of libfuse that pyfuse3 does not ask for (see packfs/fuse/fuseshim.py for
 * why and how it is loaded). Two interpositions, each off unless packfs_shim_enable
 * asked for it before the session is made:
 *
 * fuse_session_new (dircache, filecache, xattrcache, metacache): pyfuse3 hands libfuse its table
 * of low-level handlers here. This copies the table, changes the entries below and
 * calls libfuse's own fuse_session_new with the copy:
 *
 *   opendir      answers ENOSYS at once, in C, when the kernel said at INIT that it
 *                supports that (FUSE_CAP_NO_OPENDIR_SUPPORT, Linux 5.1 and later; an
 *                older one would fail the open): the kernel then stops sending OPENDIR
 *                and RELEASEDIR for the rest of the mount, and opens every directory
 *                with FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, so a listing is cached in the
 *                kernel until the directory changes. Otherwise pyfuse3's opendir runs.
 *   readdirplus  gets the directory's inode number as its file handle: without opendir
 *                the kernel sends handle 0, and pyfuse3 passes handlers the handle, not
 *                the inode. (packfs's own opendir returns the inode as the handle too;
 *                its fsyncdir needs no handle.) And the request that follows a listing's
 *                last entry is answered here, empty, when packfs noted that offset as the
 *                listing's end (packfs_shim_note_end): the kernel learns a listing has
 *                ended only from an empty reply, one more round trip per directory.
 *   open         (filecache) answers ENOSYS at once, in C, when the kernel supports
 *                that (FUSE_CAP_NO_OPEN_SUPPORT): the kernel then opens every file
 *                without OPEN or RELEASE, with FOPEN_KEEP_CACHE. It sends no RELEASE
 *                for files create() opened either: packfs gives those a handle that
 *                names the inode too (Filesystem.created_handle). With passthrough the kernel
 *                must keep asking (a file open for passthrough can be opened again only
 *                through an OPEN's reply): open and release then answer in C as if the
 *                kernel had opened the file itself (open_in_c), but for a file open for
 *                passthrough, whose OPEN and RELEASE go to packfs.
 *   read, write, write_buf  (filecache) get INODE_HANDLE | the inode as the file handle
 *                when the kernel sends 0 (a file opened without a request), and
 *                ROOT_WRITER too in a write root sent, NOATIME_READER in a read through
 *                a file opened O_NOATIME.
 *   getxattr     (xattrcache) answers from the xattrs packfs last handed over for the
 *                inode (packfs_shim_cache_xattrs), in C, if it has them; else pyfuse3's
 *                getxattr runs. A Swift GET or HEAD asks five times (its metadata key,
 *                the key after it, its checksum key, each with a size probe first): the
 *                first goes to packfs, which hands over the inode's xattrs, and the other
 *                four are answered here. With metacache the first is answered here too,
 *                from the inode table (_shimmeta.c), where C can decode the xattrs. An ENODATA hands them over too: the kernel
 *                asks for security.capability before every cached write to a file.
 *                packfs takes them back whenever they change or the inode goes
 *                (packfs_shim_forget_xattrs), before any later request can see them.
 *   listxattr    (xattrcache) answered from the same xattrs, as getxattr.
 *   lookup, getattr  (metacache) answered from the inode table itself, in C, when
 *                packfs handed it over (_shimmeta.c); else pyfuse3's run. With
 *                dircache, a readdirplus from offset 0 too: the whole listing, its end
 *                noted as packfs notes it; with filecache, a read of a file opened
 *                without a request whose data is one whole record in the page cache.
 *   init         notes what the kernel supports, then runs pyfuse3's; with filecache
 *                in force it takes FUSE_CAP_ATOMIC_O_TRUNC out of the answer, so that
 *                the kernel sends an O_TRUNC open's truncation as a SETATTR. It always
 *                takes FUSE_CAP_AUTO_INVAL_DATA out (libfuse asks for it by default):
 *                with it the kernel drops a file's whole page cache whenever a GETATTR
 *                shows an mtime other than the one it cached, and asks for that before
 *                every cached read once a write made its attributes stale. packfs is
 *                the only writer of its files, through this kernel (a direct write
 *                drops the pages it covers itself), so the pages are never stale; a
 *                database written in place (SQLite: pwrite, fstat, pread) was read back
 *                from packfs page by page.
 *
 *   fallocate    (fallocate) pyfuse3 has no handler for it, so libfuse answered ENOSYS and
 *                the kernel refused every later fallocate(2) with EOPNOTSUPP. This one
 *                hands the request to pyfuse3's setxattr handler as the xattr
 *                FALLOCATE_NAME, whose value begins with a random token drawn for the
 *                session (packfs_shim_fallocate_token) and carries the mode, offset and
 *                length: packfs answers that, and no user's setxattr can pass for it.
 *   ioctl        (whenever the table is rewritten) pyfuse3 has no handler for it, and the
 *                kernel asks every time: it keeps no refusal for ioctls, unlike most
 *                requests. Python's open() sends one (the TCGETS of its isatty check)
 *                for every file it opens buffered: a Swift GET sends one, a PUT and a
 *                DELETE one or two. This answers ENOTTY, what the kernel turned
 *                libfuse's ENOSYS into, and counts them (packfs_shim_ioctls_answered),
 *                so that the requests a mount is sent are all counted somewhere.
 *
 * fuse_session_mount (killpriv): libfuse 3.14 cannot ask for FUSE_HANDLE_KILLPRIV_V2
 * (Linux 5.12 and later): the filesystem, not the kernel, takes set-ID bits and file
 * capabilities from a file that is written, truncated or chowned. Without it the
 * kernel's cached write path asks getxattr("security.capability") before every
 * write(); with it the kernel marks the superblock SB_NOSEC and asks once per inode.
 * After libfuse's own mount this gives the session a custom I/O that reads and writes
 * /dev/fuse as libfuse would, noting whether the kernel's INIT offers the flag and
 * setting it in libfuse's INIT reply if so. packfs does what the flag promises
 * (Namespace.remove_privileges) whether the kernel agreed or not. The same I/O asks
 * for FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6 and later) when the kernel offers it: a
 * handle with direct I/O (packfs's creating handle, see direct_writes) may then be
 * mapped MAP_SHARED, where the kernel answered ENODEV before; the kernel keeps the
 * mapping's pages coherent with the handle's direct writes itself.
 *
 * The same I/O serves O_TMPFILE (tmpfile): libfuse 3.14 does not know FUSE_TMPFILE and
 * answered it ENOSYS, so the kernel refused open(O_TMPFILE) with EOPNOTSUPP. The kernel
 * sends it as a CREATE of the name "/" with another opcode; this I/O gives it CREATE's
 * opcode, so pyfuse3's create handler gets the name "/", which no real create can carry,
 * and packfs makes a file with no name there (Swift writes objects that way when it
 * can, then links them into place with linkat).
 *
 * And FUSE passthrough (passthrough; Linux 6.9 and later, CAP_SYS_ADMIN): the I/O asks
 * for FUSE_PASSTHROUGH in libfuse's INIT reply when the kernel offers it, and patches
 * the reply to a create whose handle packfs staged (packfs_shim_stage) so that the
 * kernel reads and writes that open file straight from and to packfs's staging file
 * (a backing file: FUSE_DEV_IOC_BACKING_OPEN), with no request per write; and the reply
 * to an OPEN of such a file that packfs shares (packfs_shim_share) so that it opens the
 * same backing file. libfuse 3.14 knows neither the INIT field (max_stack_depth) nor the
 * open reply's backing_id.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <linux/limits.h>
#include "_shimmeta.h"

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *, const struct fuse_lowlevel_ops *,
                                               size_t, void *);
typedef int (*session_mount_fn)(struct fuse_session *, const char *);

static int want_dircache, want_filecache, want_xattrcache, want_killpriv, want_tmpfile,
    want_fallocate, want_passthrough, want_metacache; /* packfs_shim_enable */
static int installed;    /* the last session got the rewritten table */
static int zero_message; /* ... and its kernel supports zero-message opendir */
static int zero_open;    /* ... and zero-message open, which filecache asked for */
static int opens_in_c;   /* ... or, with passthrough, OPEN and RELEASE answered here (see open_in_c) */
static struct fuse_lowlevel_ops ops;
static void (*next_init)(void *, struct fuse_conn_info *);
static void (*next_opendir)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*next_readdirplus)(fuse_req_t, fuse_ino_t, size_t, off_t, struct fuse_file_info *);
static void (*next_open)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*next_release)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*next_read)(fuse_req_t, fuse_ino_t, size_t, off_t, struct fuse_file_info *);
static void (*next_write)(fuse_req_t, fuse_ino_t, const char *, size_t, off_t, struct fuse_file_info *);
static void (*next_write_buf)(fuse_req_t, fuse_ino_t, struct fuse_bufvec *, off_t, struct fuse_file_info *);
static void (*next_getxattr)(fuse_req_t, fuse_ino_t, const char *, size_t);
static void (*next_listxattr)(fuse_req_t, fuse_ino_t, size_t);
static void (*next_setxattr)(fuse_req_t, fuse_ino_t, const char *, const char *, size_t, int);

#define INODE_HANDLE (1ULL << 63) /* a handle that names an inode, not an open (filesystem.py) */
#define ROOT_WRITER (1ULL << 62)  /* ... in a write root sent: it keeps set-ID bits */
#define NOATIME_READER (1ULL << 60) /* ... in a read through a file opened O_NOATIME */

static int init_seen;      /* the kernel's INIT request was read: init_unique is its id */
static uint64_t init_unique;
static int init_offers;    /* ... and it offered FUSE_HANDLE_KILLPRIV_V2 */
static int init_offers_mmap; /* ... and FUSE_DIRECT_IO_ALLOW_MMAP (an extended INIT's flags2) */
static int init_answered;  /* libfuse's INIT reply went out */
static int killpriv;       /* ... with FUSE_HANDLE_KILLPRIV_V2 set */
static int direct_mmap;    /* ... with FUSE_DIRECT_IO_ALLOW_MMAP set */
static int init_offers_passthrough; /* ... and FUSE_PASSTHROUGH (flags2) */
static int passthrough;    /* ... with FUSE_PASSTHROUGH set: creates may be staged */

/* Linux 6.6 (protocol 7.39); libfuse 3.14's header stops at 7.38. A flags2 bit. */
#define DIRECT_IO_ALLOW_MMAP_FLAGS2 (1u << (36 - 32))

/* Linux 6.9 (protocol 7.40), beyond libfuse 3.14's header: FUSE_PASSTHROUGH is a flags2
 * bit; fuse_init_out carries max_stack_depth after flags2, and fuse_open_out a backing_id
 * where 3.14 has padding; the device takes two ioctls. */
#define PASSTHROUGH_FLAGS2 (1u << (37 - 32))
#define INIT_OUT_MAX_STACK_DEPTH 36 /* offsetof(fuse_init_out, max_stack_depth) */
#define OPEN_OUT_BACKING_ID 12      /* offsetof(fuse_open_out, backing_id) */
#define FOPEN_PASSTHROUGH_FLAG (1u << 7)
struct backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define BACKING_OPEN _IOW(229, 1, struct backing_map)
#define BACKING_CLOSE _IOW(229, 2, uint32_t)

static void opendir_enosys(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void packfs_shim_note_end(uint64_t ino, int64_t off);
static void open_in_c(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);

static void init_noting_support(void *userdata, struct fuse_conn_info *conn)
{
    zero_message = ops.opendir == opendir_enosys && (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
    int filecache = ops.open == open_in_c && (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) != 0;
    next_init(userdata, conn);
    /* A file open for passthrough makes the kernel refuse (EIO) any other open of it but one
     * for passthrough with the same backing file, which only an OPEN's reply can ask for. */
    int passing = want_passthrough && init_offers_passthrough && !(conn->want & FUSE_CAP_WRITEBACK_CACHE);
    zero_open = filecache && !passing;
    opens_in_c = filecache && passing;
    if (filecache) /* no OPEN packfs sees carries O_TRUNC: the kernel must send it as a SETATTR */
        conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
    /* Every change to a file comes through this kernel, so its cached pages are never
     * stale: they must not be dropped whenever a GETATTR shows a new mtime. */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

static int backing_of_inode(fuse_ino_t ino);
static int staged_handle(uint64_t fh);
static unsigned long long opens_answered, releases_answered;

/* filecache: the kernel opens files without a request once an OPEN answered ENOSYS. With
 * passthrough that cannot be (see init_noting_support): the OPEN is answered here as the
 * kernel would have opened the file itself (handle 0, its pages kept), but for a file
 * open for passthrough, whose OPEN goes to packfs (ops.open shares the backing file). */
static void open_in_c(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (zero_open) {
        fuse_reply_err(req, ENOSYS);
    } else if (opens_in_c && backing_of_inode(ino) <= 0) {
        fi->fh = 0;
        fi->keep_cache = 1;
        fi->direct_io = 0;
        opens_answered++;
        fuse_reply_open(req, fi);
    } else {
        next_open(req, ino, fi);
    }
}

/* ... and the RELEASE of such a file, or of one create() opened (a handle that names the
 * inode: Filesystem.created_handle), which a kernel opening files without a request never sends.
 * A staged create's RELEASE goes to packfs. */
static void release_in_c(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (opens_in_c && (fi->fh == 0 || ((fi->fh & INODE_HANDLE) && !staged_handle(fi->fh)))) {
        releases_answered++;
        fuse_reply_err(req, 0);
    } else {
        next_release(req, ino, fi);
    }
}

/* A file opened without a request has handle 0: name its inode instead, for a write
 * whether root sent it (pyfuse3 gives write handlers no request context), and for a read
 * whether the file was opened O_NOATIME (a READ carries the open's flags; pyfuse3 drops
 * them): packfs leaves its atime alone then. */
static void by_inode(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int writing)
{
    if (fi->fh == 0)
        fi->fh = INODE_HANDLE | (writing && fuse_req_ctx(req)->uid == 0 ? ROOT_WRITER : 0) |
                 (!writing && (fi->flags & O_NOATIME) ? NOATIME_READER : 0) | ino;
}

static void read_by_inode(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    by_inode(req, ino, fi, 0);
    if ((fi->fh & INODE_HANDLE) && (fi->fh & ~(INODE_HANDLE | NOATIME_READER)) == ino &&
        packfs_shim_meta_installed(&ops) && packfs_shim_meta_read(req, ino, size, off, (fi->fh & NOATIME_READER) != 0))
        return; /* (metacache) a whole record in the page cache, read and checked in C */
    next_read(req, ino, size, off, fi);
}

static void write_by_inode(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                           struct fuse_file_info *fi)
{
    by_inode(req, ino, fi, 1);
    next_write(req, ino, buf, size, off, fi);
}

static void write_buf_by_inode(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
                               struct fuse_file_info *fi)
{
    by_inode(req, ino, fi, 1);
    next_write_buf(req, ino, bufv, off, fi);
}

static void opendir_enosys(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (zero_message)
        fuse_reply_err(req, ENOSYS);
    else
        next_opendir(req, ino, fi);
}

/* Listing ends packfs noted, by directory (a few slots: a walk lists one directory at a
 * time per reader). Touched only on the event loop's thread, where pyfuse3 processes every
 * request and packfs calls packfs_shim_note_end. */
#define END_SLOTS 64
static struct {
    fuse_ino_t ino; /* 0: free */
    off_t off;      /* the offset just past the listing's last entry */
} ends[END_SLOTS];
static unsigned long long ends_answered;

static void readdirplus_by_inode(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                                 struct fuse_file_info *fi)
{
    unsigned slot = ino % END_SLOTS;
    if (off != 0 && ends[slot].ino == ino && ends[slot].off == off) {
        ends[slot].ino = 0;
        ends_answered++;
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (off == 0 && packfs_shim_meta_installed(&ops)) { /* (metacache) the whole listing, from the table */
        char *buf = malloc(size);
        off_t end = 0;
        ssize_t used = buf ? packfs_shim_meta_listing(req, ino, size, buf, &end) : -1;
        if (used >= 0) {
            if (end)
                packfs_shim_note_end(ino, end);
            fuse_reply_buf(req, buf, used);
        }
        free(buf);
        if (used >= 0)
            return;
    }
    fi->fh = ino;
    next_readdirplus(req, ino, size, off, fi);
}

/* Xattrs packfs handed over, by inode: each a packed plain blob, `<u16 name length><u32
 * value length><name><value>` per xattr, little-endian (packfs/namespace/xattrblob.py). A slot
 * per inode number modulo XATTR_SLOTS: a Swift GET reads one file's xattrs five times in
 * a row, and 16 concurrent GETs rarely share a slot (~0.5 pairs of 16 do). ~110 KiB at
 * most for Swift's ~440 B. Touched only on the event loop's thread, like `ends`. */
#define XATTR_SLOTS 256
static struct {
    fuse_ino_t ino; /* 0: free */
    unsigned char *blob;
    size_t len;
} xattrs[XATTR_SLOTS];
static unsigned long long xattrs_answered, listings_of_xattrs_answered;

static uint32_t le(const unsigned char *p, int n)
{
    uint32_t v = 0;
    while (n--)
        v = v << 8 | p[n];
    return v;
}

/* Whether `name` is in a namespace packfs stores, with a name after the prefix: of any
 * other name that is absent packfs says EOPNOTSUPP or EINVAL, as XFS does. */
static int stored_namespace(const char *name)
{
    static const char *const prefixes[] = {"user.", "trusted.", "security."};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        size_t n = strlen(prefixes[i]);
        if (strncmp(name, prefixes[i], n) == 0)
            return name[n] != '\0';
    }
    return 0;
}

/* Files packfs made and whose xattrs have not changed since (packfs_shim_note_new), by the
 * same slots: they have no security.capability. The kernel asks for it once per inode,
 * before a file's first fallocate (Swift's reservation) or cached write; the files' other
 * xattrs still go to packfs, whose first xattr read of a file starts its prefetch. */
static fuse_ino_t new_files[XATTR_SLOTS];

static int xattrs_at_hand(fuse_ino_t ino);

/* A getxattr's or listxattr's answer of n bytes to a request for `size`: the size for a
 * probe (size 0), ERANGE if they do not fit. */
static void reply_xattr(fuse_req_t req, const char *buf, size_t n, size_t size)
{
    if (size == 0)
        fuse_reply_xattr(req, n);
    else if (size < n)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, buf, n);
}

static void getxattr_cached(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    unsigned slot = ino % XATTR_SLOTS;
    if (new_files[slot] == ino && strcmp(name, "security.capability") == 0) {
        xattrs_answered++;
        fuse_reply_err(req, ENODATA);
        return;
    }
    if (!xattrs_at_hand(ino)) {
        next_getxattr(req, ino, name, size);
        return;
    }
    const unsigned char *p = xattrs[slot].blob, *end = p + xattrs[slot].len;
    size_t want = strlen(name);
    while (end - p >= 6) {
        size_t nlen = le(p, 2), vlen = le(p + 2, 4);
        const unsigned char *n = p + 6;
        if ((size_t)(end - n) < nlen + vlen)
            break; /* cannot happen (packfs made the blob): let packfs answer */
        const unsigned char *v = n + nlen;
        if (nlen == want && memcmp(n, name, nlen) == 0) {
            xattrs_answered++;
            reply_xattr(req, (const char *)v, vlen, size);
            return;
        }
        p = v + vlen;
    }
    if (p != end || !stored_namespace(name)) {
        next_getxattr(req, ino, name, size);
        return;
    }
    xattrs_answered++;
    fuse_reply_err(req, ENODATA);
}

/* Whether ino's xattrs are in its slot: handed over by packfs, or (metacache) taken from
 * the inode table now. */
static int xattrs_at_hand(fuse_ino_t ino)
{
    return xattrs[ino % XATTR_SLOTS].ino == ino || (packfs_shim_meta_installed(&ops) && packfs_shim_meta_hand_xattrs(ino));
}

/* listxattr from the same slots: the names, each NUL-terminated, in the order packfs
 * gives them (rsync -X lists every file it sends or receives). */
static void listxattr_cached(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    if (!xattrs_at_hand(ino)) {
        next_listxattr(req, ino, size);
        return;
    }
    unsigned slot = ino % XATTR_SLOTS;
    const unsigned char *p = xattrs[slot].blob, *end = p + xattrs[slot].len;
    char names[XATTR_LIST_MAX];
    size_t used = 0;
    while (end - p >= 6) {
        size_t nlen = le(p, 2), vlen = le(p + 2, 4);
        if ((size_t)(end - p - 6) < nlen + vlen || used + nlen + 1 > sizeof names)
            break; /* (the first cannot happen: packfs made the blob) */
        memcpy(names + used, p + 6, nlen);
        used += nlen;
        names[used++] = 0;
        p += 6 + nlen + vlen;
    }
    if (p != end) {
        next_listxattr(req, ino, size);
        return;
    }
    listings_of_xattrs_answered++;
    reply_xattr(req, names, used, size);
}

static void forget_slot(unsigned slot)
{
    free(xattrs[slot].blob);
    xattrs[slot].ino = 0;
    xattrs[slot].blob = NULL;
    xattrs[slot].len = 0;
}

/* A fallocate as pyfuse3's setxattr handler gets it (see the top): the xattr FALLOCATE_NAME
 * with the value `<token><i32 mode><i64 offset><i64 length>`, native byte order. */
#define FALLOCATE_NAME "packfs.fallocate"
#define TOKEN_SIZE 16
static unsigned char fallocate_token[TOKEN_SIZE];

static void fallocate_as_setxattr(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                                  struct fuse_file_info *fi)
{
    (void)fi;
    unsigned char value[TOKEN_SIZE + 4 + 8 + 8];
    int32_t m = mode;
    int64_t o = offset, l = length;
    memcpy(value, fallocate_token, TOKEN_SIZE);
    memcpy(value + TOKEN_SIZE, &m, 4);
    memcpy(value + TOKEN_SIZE + 4, &o, 8);
    memcpy(value + TOKEN_SIZE + 12, &l, 8);
    next_setxattr(req, ino, FALLOCATE_NAME, (const char *)value, sizeof value, 0);
}

static unsigned long long ioctls_answered;

static void ioctl_unsupported(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg, struct fuse_file_info *fi,
                              unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
    (void)ino, (void)cmd, (void)arg, (void)fi, (void)flags, (void)in_buf, (void)in_bufsz, (void)out_bufsz;
    ioctls_answered++;
    fuse_reply_err(req, ENOTTY);
}

struct fuse_session *fuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *op,
                                      size_t op_size, void *userdata)
{
    session_new_fn next = (session_new_fn)dlsym(RTLD_NEXT, "fuse_session_new");
    if (next == NULL)
        return NULL;
    installed = zero_message = zero_open = opens_in_c = 0;
    memset(ends, 0, sizeof ends);
    memset(new_files, 0, sizeof new_files);
    for (unsigned slot = 0; slot < XATTR_SLOTS; slot++)
        forget_slot(slot);
    init_seen = init_offers = init_offers_mmap = init_answered = killpriv = direct_mmap = 0;
    int dircache = want_dircache && op->opendir && op->readdirplus;
    int filecache = want_filecache && op->open && op->release && op->read && op->write && op->write_buf;
    int xattrcache = want_xattrcache && op->getxattr && op->listxattr;
    int fallocate = want_fallocate && op->setxattr && op->fallocate == NULL &&
                    getrandom(fallocate_token, TOKEN_SIZE, 0) == TOKEN_SIZE;
    int metacache = want_metacache && op->lookup && op->getattr;
    if (!(dircache || filecache || xattrcache || fallocate || metacache) || op_size > sizeof ops || op->init == NULL)
        return next(args, op, op_size, userdata);
    memcpy(&ops, op, op_size);
    next_init = op->init;
    ops.init = init_noting_support;
    if (dircache) {
        next_opendir = op->opendir;
        next_readdirplus = op->readdirplus;
        ops.opendir = opendir_enosys;
        ops.readdirplus = readdirplus_by_inode;
    }
    if (filecache) {
        next_open = op->open;
        next_release = op->release;
        next_read = op->read;
        next_write = op->write;
        next_write_buf = op->write_buf;
        ops.open = open_in_c;
        ops.release = release_in_c;
        ops.read = read_by_inode;
        ops.write = write_by_inode;
        ops.write_buf = write_buf_by_inode;
    }
    if (xattrcache) {
        next_getxattr = op->getxattr;
        next_listxattr = op->listxattr;
        ops.getxattr = getxattr_cached;
        ops.listxattr = listxattr_cached;
    }
    if (fallocate) {
        next_setxattr = op->setxattr;
        ops.fallocate = fallocate_as_setxattr;
    }
    if (metacache)
        packfs_shim_meta_install(&ops);
    if (op->ioctl == NULL)
        ops.ioctl = ioctl_unsupported;
    struct fuse_session *se = next(args, &ops, op_size, userdata);
    installed = se != NULL;
    return se;
}

static int custom_io;               /* the last session's I/O is read_request's (see fuse_session_mount) */
static unsigned long long tmpfiles; /* TMPFILE requests given CREATE's opcode */

/* The kernel's O_TMPFILE open as a CREATE of "/" (see the top), if it names "/" as the
 * kernel does; any other stays a TMPFILE, which libfuse answers ENOSYS. */
static void tmpfile_as_create(struct fuse_in_header *in, ssize_t n)
{
    const size_t name_at = sizeof *in + sizeof(struct fuse_create_in);
    if (want_tmpfile && n >= (ssize_t)(name_at + 2) && in->len == (uint32_t)n &&
        memcmp((const char *)in + name_at, "/", 2) == 0) {
        in->opcode = FUSE_CREATE;
        tmpfiles++;
    }
}

static ssize_t read_request(int fd, void *buf, size_t len, void *userdata)
{
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n >= (ssize_t)sizeof(struct fuse_in_header) && ((struct fuse_in_header *)buf)->opcode == FUSE_TMPFILE)
        tmpfile_as_create(buf, n);
    if (!init_seen && n >= (ssize_t)(sizeof(struct fuse_in_header) + 16)) {
        const struct fuse_in_header *in = buf;
        if (in->opcode == FUSE_INIT) {
            const struct fuse_init_in *arg = (const struct fuse_init_in *)(in + 1);
            init_seen = 1;
            init_unique = in->unique;
            init_offers = (arg->flags & FUSE_HANDLE_KILLPRIV_V2) != 0;
            init_offers_mmap = (arg->flags & FUSE_INIT_EXT) &&
                               n >= (ssize_t)(sizeof(struct fuse_in_header) + offsetof(struct fuse_init_in, flags2) + 4) &&
                               (arg->flags2 & DIRECT_IO_ALLOW_MMAP_FLAGS2);
            init_offers_passthrough = (arg->flags & FUSE_INIT_EXT) &&
                                      n >= (ssize_t)(sizeof(struct fuse_in_header) + offsetof(struct fuse_init_in, flags2) + 4) &&
                                      (arg->flags2 & PASSTHROUGH_FLAGS2);
        }
    }
    return n;
}

/* Creates packfs staged: the handle its reply carries, the file's inode, the staging
 * file's descriptor, and once the reply went out, the backing id the kernel gave it (0:
 * none yet; < 0: the kernel refused, -errno). Only ever touched on the event loop's thread. */
#define STAGED_MAX 256
static struct {
    uint64_t fh;
    fuse_ino_t ino;
    int fd;
    int backing_id;
} staged[STAGED_MAX];
static int staged_count;
static int dev_fd = -1;

/* Opens of a staged file packfs answered with a handle of its own (packfs_shim_share),
 * whose replies are still to go out: each is given the staged file's backing file. */
#define SHARES_MAX 64
static struct {
    uint64_t fh;
    int backing_id;
} shares[SHARES_MAX];
static int shares_count;

int packfs_shim_stage(uint64_t fh, uint64_t ino, int fd)
{
    if (!passthrough || staged_count == STAGED_MAX)
        return 0;
    staged[staged_count].fh = fh;
    staged[staged_count].ino = ino;
    staged[staged_count].fd = fd;
    staged[staged_count].backing_id = 0;
    staged_count++;
    return 1;
}

static int staged_handle(uint64_t fh)
{
    for (int i = 0; i < staged_count; i++)
        if (staged[i].fh == fh)
            return 1;
    return 0;
}

/* The backing id of the file `ino` while it is open for passthrough, else <= 0. */
static int backing_of_inode(fuse_ino_t ino)
{
    for (int i = 0; i < staged_count; i++)
        if (staged[i].ino == ino && staged[i].backing_id > 0)
            return staged[i].backing_id;
    return 0;
}

/* An OPEN of the staged file `ino` is about to be answered with handle `fh`: that reply
 * opens it for passthrough too, with the same backing file, which is all the kernel
 * allows while the file is open for passthrough. 0 if the file has no backing file (it
 * is not open for passthrough) or too many such replies wait. */
int packfs_shim_share(uint64_t ino, uint64_t fh)
{
    int id = backing_of_inode(ino);
    if (id <= 0 || shares_count == SHARES_MAX)
        return 0;
    shares[shares_count].fh = fh;
    shares[shares_count].backing_id = id;
    shares_count++;
    return 1;
}

/* The handle `fh` was released: no reply of it waits (one that failed before it went out). */
void packfs_shim_unshare(uint64_t fh)
{
    for (int i = 0; i < shares_count; i++)
        if (shares[i].fh == fh) {
            shares[i] = shares[--shares_count];
            return;
        }
}

/* What became of a staged handle: its backing id once its reply went out with one, 0
 * before that, -errno if the kernel refused the staging file (the open then went
 * ahead without it, its writes come as requests). */
int packfs_shim_staged_id(uint64_t fh)
{
    for (int i = 0; i < staged_count; i++)
        if (staged[i].fh == fh)
            return staged[i].backing_id;
    return 0;
}

/* Forget a staged handle (its file was closed, or the kernel refused it): gives back
 * its backing id, if it had one. */
void packfs_shim_unstage(uint64_t fh)
{
    for (int i = 0; i < staged_count; i++) {
        if (staged[i].fh != fh)
            continue;
        if (staged[i].backing_id > 0) {
            uint32_t arg = (uint32_t)staged[i].backing_id;
            ioctl(dev_fd, BACKING_CLOSE, &arg);
        }
        staged[i] = staged[--staged_count];
        return;
    }
}

/* The reply to a create of a staged handle: register its staging file with the kernel and
 * have the open use it. The flags are the backing file's only: passthrough refuses others
 * (the kernel caches nothing of such a file, and writes go straight to the backing file). */
static void stage_reply(int fd, struct iovec *iov, int count)
{
    if (count < 2 || iov[1].iov_len != sizeof(struct fuse_entry_out) + sizeof(struct fuse_open_out) ||
        ((struct fuse_out_header *)iov[0].iov_base)->error != 0)
        return;
    struct fuse_open_out *open_out = (struct fuse_open_out *)((char *)iov[1].iov_base + sizeof(struct fuse_entry_out));
    for (int i = 0; i < staged_count; i++) {
        if (staged[i].fh != open_out->fh || staged[i].backing_id != 0)
            continue;
        struct backing_map map = {.fd = staged[i].fd};
        int id = ioctl(fd, BACKING_OPEN, &map);
        if (id <= 0) {
            staged[i].backing_id = id < 0 ? -errno : -EIO;
            return;
        }
        dev_fd = fd;
        staged[i].backing_id = id;
        open_out->open_flags = FOPEN_PASSTHROUGH_FLAG;
        memcpy((char *)open_out + OPEN_OUT_BACKING_ID, &id, sizeof id);
        return;
    }
}

/* The reply to an OPEN packfs shared (packfs_shim_share): the staged file's backing file. */
static void share_reply(struct iovec *iov, int count)
{
    if (count < 2 || iov[1].iov_len != sizeof(struct fuse_open_out) ||
        ((struct fuse_out_header *)iov[0].iov_base)->error != 0)
        return;
    struct fuse_open_out *open_out = iov[1].iov_base;
    for (int i = 0; i < shares_count; i++) {
        if (shares[i].fh != open_out->fh)
            continue;
        int id = shares[i].backing_id;
        open_out->open_flags = FOPEN_PASSTHROUGH_FLAG;
        memcpy((char *)open_out + OPEN_OUT_BACKING_ID, &id, sizeof id);
        shares[i] = shares[--shares_count];
        return;
    }
}

static ssize_t writev_asking_more(int fd, struct iovec *iov, int count, void *userdata)
{
    (void)userdata;
    if (init_seen && !init_answered && count >= 2 && iov[0].iov_len >= sizeof(struct fuse_out_header) &&
        ((struct fuse_out_header *)iov[0].iov_base)->unique == init_unique) {
        init_answered = 1;
        struct fuse_out_header *out = iov[0].iov_base;
        struct fuse_init_out *reply = iov[1].iov_base;
        if (init_offers && out->error == 0 && iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + 4) {
            reply->flags |= FUSE_HANDLE_KILLPRIV_V2;
            killpriv = 1;
        }
        if (init_offers_mmap && out->error == 0 && iov[1].iov_len >= offsetof(struct fuse_init_out, flags2) + 4) {
            reply->flags |= FUSE_INIT_EXT; /* (libfuse sets it too when the kernel's INIT has it) */
            reply->flags2 |= DIRECT_IO_ALLOW_MMAP_FLAGS2;
            direct_mmap = 1;
        }
        if (want_passthrough && init_offers_passthrough && out->error == 0 &&
            iov[1].iov_len >= INIT_OUT_MAX_STACK_DEPTH + 4 && !(reply->flags & FUSE_WRITEBACK_CACHE)) {
            reply->flags |= FUSE_INIT_EXT;
            reply->flags2 |= PASSTHROUGH_FLAGS2;
            uint32_t depth = 1; /* backing files on a filesystem that stacks on nothing */
            memcpy((char *)reply + INIT_OUT_MAX_STACK_DEPTH, &depth, sizeof depth);
            passthrough = 1;
        }
    } else if (staged_count > 0) {
        stage_reply(fd, iov, count);
        if (shares_count > 0)
            share_reply(iov, count);
    }
    return writev(fd, iov, count);
}

static const struct fuse_custom_io init_io = {.read = read_request, .writev = writev_asking_more};

int fuse_session_mount(struct fuse_session *se, const char *mountpoint)
{
    session_mount_fn next = (session_mount_fn)dlsym(RTLD_NEXT, "fuse_session_mount");
    if (next == NULL)
        return -1;
    int r = next(se, mountpoint);
    custom_io = r == 0 && (want_killpriv || want_tmpfile || want_passthrough) &&
                fuse_session_custom_io(se, &init_io, fuse_session_fd(se)) == 0; /* the same fd: only the I/O changes */
    return r;
}

void packfs_shim_enable(int dircache, int filecache, int xattrcache, int kill_priv, int tmpfile, int fallocate,
                        int pass_through, int metacache)
{
    want_metacache = metacache;
    want_passthrough = pass_through;
    want_dircache = dircache;
    want_filecache = filecache;
    want_xattrcache = xattrcache;
    want_killpriv = kill_priv;
    want_tmpfile = tmpfile;
    want_fallocate = fallocate;
}

int packfs_shim_installed(void)
{
    return installed;
}

int packfs_shim_answers_metadata(void)
{
    return installed && packfs_shim_meta_installed(&ops);
}

/* packfs's readdir gave the kernel every entry of a listing of `ino`, the last with
 * `off` as the offset to resume at: a readdir from there is the listing's end. */
void packfs_shim_note_end(uint64_t ino, int64_t off)
{
    unsigned slot = ino % END_SLOTS;
    ends[slot].ino = ino;
    ends[slot].off = off;
}

/* The xattrs of `ino`, packed plain (len 0: it has none): answer its getxattrs from
 * these until packfs_shim_forget_xattrs. 0 if there was no memory for them. */
int packfs_shim_cache_xattrs(uint64_t ino, const char *blob, size_t len)
{
    unsigned slot = ino % XATTR_SLOTS;
    unsigned char *copy = malloc(len ? len : 1);
    forget_slot(slot);
    if (copy == NULL)
        return 0;
    memcpy(copy, blob, len);
    xattrs[slot].ino = ino;
    xattrs[slot].blob = copy;
    xattrs[slot].len = len;
    return 1;
}

/* The xattrs of `ino` changed, or the inode went (its number may come back as another's). */
void packfs_shim_forget_xattrs(uint64_t ino)
{
    unsigned slot = ino % XATTR_SLOTS;
    if (xattrs[slot].ino == ino)
        forget_slot(slot);
    if (new_files[slot] == ino)
        new_files[slot] = 0;
}

/* packfs just made `ino`: it has no xattrs (see new_files). */
void packfs_shim_note_new(uint64_t ino)
{
    new_files[ino % XATTR_SLOTS] = ino;
}

unsigned long long packfs_shim_listxattrs_answered(void)
{
    return listings_of_xattrs_answered;
}

unsigned long long packfs_shim_xattrs_answered(void)
{
    return xattrs_answered;
}

int packfs_shim_caches_xattrs(void)
{
    return installed && ops.getxattr == getxattr_cached;
}

unsigned long long packfs_shim_ends_answered(void)
{
    return ends_answered;
}

int packfs_shim_answers_listing_ends(void)
{
    return installed && ops.readdirplus == readdirplus_by_inode;
}

int packfs_shim_zero_message_opendir(void)
{
    return installed && zero_message;
}

int packfs_shim_zero_message_open(void)
{
    return installed && zero_open;
}

int packfs_shim_opens_in_c(void)
{
    return installed && opens_in_c;
}

unsigned long long packfs_shim_opens_answered(void)
{
    return opens_answered;
}

unsigned long long packfs_shim_releases_answered(void)
{
    return releases_answered;
}

/* Copies the session's fallocate token into out (TOKEN_SIZE bytes); 0 if fallocate does
 * not go through the library. */
int packfs_shim_fallocate_token(unsigned char *out)
{
    if (!(installed && ops.fallocate == fallocate_as_setxattr))
        return 0;
    memcpy(out, fallocate_token, TOKEN_SIZE);
    return 1;
}

unsigned long long packfs_shim_ioctls_answered(void)
{
    return ioctls_answered;
}

unsigned long long packfs_shim_tmpfiles(void)
{
    return tmpfiles;
}

int packfs_shim_serves_tmpfile(void)
{
    return custom_io && want_tmpfile;
}

int packfs_shim_killpriv(void)
{
    return killpriv;
}

int packfs_shim_passthrough(void)
{
    return passthrough;
}

int packfs_shim_direct_mmap(void)
{
    return direct_mmap;
}
