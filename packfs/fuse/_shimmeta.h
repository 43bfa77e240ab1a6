/* LOOKUP, GETATTR, whole listings and warm READs and first GETXATTRs answered in C from the inode table (_shimmeta.c), for _fuseshim.c. */
#ifndef PACKFS_SHIMMETA_H
#define PACKFS_SHIMMETA_H
#include <fuse_lowlevel.h>

enum { META_LOOKUP, META_LOOKUP_MISS, META_GETATTR, META_LISTING, META_READ, META_OPS }; /* packfs_shim_meta_answered's counts */

/* Give the session's handler table C's lookup and getattr, pyfuse3's behind them. */
void packfs_shim_meta_install(struct fuse_lowlevel_ops *ops);
/* A whole listing from offset 0 into buf (see _shimmeta.c); -1 if it is Python's. */
ssize_t packfs_shim_meta_listing(fuse_req_t req, uint64_t d, size_t size, char *buf, off_t *end);
/* Whether the table has them. */
int packfs_shim_meta_installed(const struct fuse_lowlevel_ops *ops);
/* A READ answered from a whole record in the page cache (see _shimmeta.c): 0 if it is Python's. */
int packfs_shim_meta_read(fuse_req_t req, uint64_t ino, size_t size, off_t off, int noatime);
/* Hand an inode's xattrs from the table to packfs_shim_cache_xattrs and start the read of
 * its data, as packfs's first getxattr of a file does; 0 if that is Python's. */
int packfs_shim_meta_hand_xattrs(uint64_t ino);
/* _fuseshim.c's: answer getxattr of ino from these packed plain xattrs. */
int packfs_shim_cache_xattrs(uint64_t ino, const char *blob, size_t len);
#define META_FLAT 14 /* the values packfs_shim_meta_*_flat give */
#endif
