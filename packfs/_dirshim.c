/*
 * Zero-message opendir for pyfuse3 (see packfs/dirshim.py for why and how it is loaded).
 *
 * pyfuse3 hands libfuse its table of low-level handlers in fuse_session_new(). This
 * library defines fuse_session_new too; loaded into the global symbol scope before that
 * call, it is the one pyfuse3 reaches. It copies the table, changes three entries and
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
 *                its fsyncdir needs no handle.)
 *   init         notes what the kernel supports, then runs pyfuse3's.
 *
 * Nothing changes unless packfs_dirshim_enable(1) was called before the session is made.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <fuse_lowlevel.h>

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *, const struct fuse_lowlevel_ops *,
                                               size_t, void *);

static int enabled;      /* asked for by packfs_dirshim_enable */
static int installed;    /* the last session got the rewritten table */
static int zero_message; /* ... and its kernel supports zero-message opendir */
static struct fuse_lowlevel_ops ops;
static void (*next_init)(void *, struct fuse_conn_info *);
static void (*next_opendir)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*next_readdirplus)(fuse_req_t, fuse_ino_t, size_t, off_t, struct fuse_file_info *);

static void init_noting_support(void *userdata, struct fuse_conn_info *conn)
{
    zero_message = (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
    next_init(userdata, conn);
}

static void opendir_enosys(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (zero_message)
        fuse_reply_err(req, ENOSYS);
    else
        next_opendir(req, ino, fi);
}

static void readdirplus_by_inode(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                                 struct fuse_file_info *fi)
{
    fi->fh = ino;
    next_readdirplus(req, ino, size, off, fi);
}

struct fuse_session *fuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *op,
                                      size_t op_size, void *userdata)
{
    session_new_fn next = (session_new_fn)dlsym(RTLD_NEXT, "fuse_session_new");
    if (next == NULL)
        return NULL;
    installed = zero_message = 0;
    if (!enabled || op_size > sizeof ops || op->init == NULL || op->opendir == NULL || op->readdirplus == NULL)
        return next(args, op, op_size, userdata);
    memcpy(&ops, op, op_size);
    next_init = op->init;
    next_opendir = op->opendir;
    next_readdirplus = op->readdirplus;
    ops.init = init_noting_support;
    ops.opendir = opendir_enosys;
    ops.readdirplus = readdirplus_by_inode;
    struct fuse_session *se = next(args, &ops, op_size, userdata);
    installed = se != NULL;
    return se;
}

void packfs_dirshim_enable(int on)
{
    enabled = on;
}

int packfs_dirshim_installed(void)
{
    return installed;
}

int packfs_dirshim_active(void)
{
    return installed && zero_message;
}
