package client

import (
	"context"
	"iter"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// NameOption configures a Delete or a Rename.
type NameOption func(*nameOptions)

type nameOptions struct {
	syncDirs  bool
	noReplace bool
}

// WithSyncDirs makes a Delete or Rename durable before it returns: the
// daemon fsyncs the directories whose entries it changed (a Rename's both
// parents). Default: off, and the change is durable once those directories
// are synced by a later call (SyncDir, or another Delete or Rename with
// WithSyncDirs in them).
func WithSyncDirs() NameOption { return func(o *nameOptions) { o.syncDirs = true } }

// WithNoReplace makes a Rename fail with ALREADY_EXISTS, changing nothing,
// rather than replace a file at the new path. Default: off (replace, as
// rename(2)). Delete ignores it.
func WithNoReplace() NameOption { return func(o *nameOptions) { o.noReplace = true } }

func nameOpts(opts []NameOption) nameOptions {
	var o nameOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Delete removes the file at path: writes to it that started before finish
// first, and once Delete returns the path names no file (a later write
// creates a new one). A File or WriteStream open on it fails its later
// writes with NOT_FOUND. A missing file is NOT_FOUND, a directory
// INVALID_ARGUMENT. It is not retried: a second Delete of the same path
// may delete a file created in between.
func (c *Client) Delete(ctx context.Context, path string, opts ...NameOption) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	o := nameOpts(opts)
	_, err := c.api.Delete(c.outgoing(ctx, path), &filewritev1.DeleteRequest{Path: path, Sync: o.syncDirs})
	return wrapErr(err)
}

// Rename gives the file at oldPath the name newPath, atomically, creating
// newPath's missing parent directories, and replacing a file at newPath
// unless WithNoReplace. Files open on the file write on to it under its
// new name. Renaming a path onto itself does nothing; a directory on either
// side is INVALID_ARGUMENT. It is not retried: once it succeeded, a second
// attempt finds no file at oldPath.
//
// With WithTargets, the call goes to the daemon that owns oldPath, where
// the file is; it must own newPath too, or calls for newPath will not find
// the file there: rename only between paths of one owner.
//
// The atomic publish of a file: write it under a temporary name, Sync it,
// then Rename it over the target WithSyncDirs.
func (c *Client) Rename(ctx context.Context, oldPath, newPath string, opts ...NameOption) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	o := nameOpts(opts)
	_, err := c.api.Rename(c.outgoing(ctx, oldPath), &filewritev1.RenameRequest{
		Path: oldPath, NewPath: newPath, NoReplace: o.noReplace, Sync: o.syncDirs,
	})
	return wrapErr(err)
}

// SyncDir makes durable the entries created, removed and renamed in the
// directory dir before the call (fsync of the directory), for Deletes and
// Renames made without WithSyncDirs. The root has no path here: a Delete
// or Rename WithSyncDirs in it syncs it.
func (c *Client) SyncDir(ctx context.Context, dir string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	_, err := c.api.Fsync(c.outgoing(ctx, dir), &filewritev1.FsyncRequest{Path: dir})
	return wrapErr(err)
}

// ListOption configures a List.
type ListOption func(*listOptions)

type listOptions struct {
	pageSize int32
}

// WithPageSize sets how many entries List asks for at a time, at most the
// daemon's maximum (10000). Default: the daemon's default (1000).
func WithPageSize(n int) ListOption { return func(o *listOptions) { o.pageSize = int32(n) } }

// List returns the entries of the directory dir ("" is the root), in
// byte-wise name order, fetching them a page at a time as the loop goes:
//
//	for e, err := range c.List(ctx, "ckpt") {
//		if err != nil {
//			return err
//		}
//		fmt.Println(e.Name, e.Size)
//	}
//
// An error ends the sequence. Each entry present from the first page to
// the last is listed exactly once, whatever is added or removed meanwhile.
// With WithTargets, only the files the daemon that owns dir's path holds
// are listed.
func (c *Client) List(ctx context.Context, dir string, opts ...ListOption) iter.Seq2[DirEntry, error] {
	var o listOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(yield func(DirEntry, error) bool) {
		if err := c.checkOpen(); err != nil {
			yield(DirEntry{}, err)
			return
		}
		token := ""
		for {
			resp, err := c.api.List(c.outgoing(ctx, dir), &filewritev1.ListRequest{Path: dir, PageSize: o.pageSize, PageToken: token})
			if err != nil {
				yield(DirEntry{}, wrapErr(err))
				return
			}
			for _, e := range resp.GetEntries() {
				if !yield(DirEntry{Name: e.GetName(), IsDir: e.GetIsDir(), Size: e.GetSize()}, nil) {
					return
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				return
			}
		}
	}
}
