//go:build !linux

package store

// The store is built on Linux system calls and their semantics: O_DIRECT,
// fallocate(2)'s FALLOC_FL_* modes, sync_file_range(2), FIEMAP, fdatasync
// and the writeback-error rules the group commit relies on. Every other
// file of the package carries //go:build linux, so on another system this
// is all that builds, and it stops the build with one message that says
// why.
const _ = filewrite_store_builds_on_Linux_only
